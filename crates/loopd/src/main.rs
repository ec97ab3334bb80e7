fn main() {
    eprintln!("loopd: not built yet");
    std::process::exit(2);
}
