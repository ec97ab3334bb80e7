//! One chat streamed through the client alone: `cargo run -p loopd-client --example stream_chat
//! -- /run/inferproxy/infer.sock smollm2 "Name three colours."` (the socket inferproxy listens
//! on, the model the router serves, the prompt). The reply is printed as it comes; the finish
//! reason and the generated token count follow it.

use loopd_client::llama::{ChatEvent, ChatRequest, Client};
use loopd_client::ClientConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let socket = args
        .next()
        .unwrap_or_else(|| "/run/inferproxy/infer.sock".into());
    let model = args.next().unwrap_or_else(|| "smollm2".into());
    let prompt = args.next().unwrap_or_else(|| "Name three colours.".into());

    let client = Client::new(ClientConfig::new(socket, model));
    let request = ChatRequest::user(0, prompt);
    let done = client.chat_with_retry(&request, &mut |event: &ChatEvent| {
        if let ChatEvent::Content(text) = event {
            print!("{text}");
        }
    })?;
    let tokens = done.timings.map_or(0, |t| t.predicted_n);
    println!("\n{:?} after {tokens} tokens", done.finish_reason);
    Ok(())
}
