//! The `capwire` command-line tool.

fn main() {
    println!("capwire {}", env!("CARGO_PKG_VERSION"));
}
