//! Prints the key agreement known-answer vectors (see `conclave_gka::kat`).
fn main() {
    println!(
        "{}",
        serde_json::to_string_pretty(&conclave_gka::kat::generate()).expect("JSON")
    );
}
