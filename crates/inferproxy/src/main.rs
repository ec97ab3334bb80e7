fn main() {
    eprintln!("inferproxy: not built yet");
    std::process::exit(2);
}
