fn main() {
    println!("outbox-cdc: not yet wired");
}
