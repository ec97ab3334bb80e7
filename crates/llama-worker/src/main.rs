fn main() {
    eprintln!("llama-worker: not built yet");
    std::process::exit(2);
}
