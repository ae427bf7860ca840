//! For in-test servers that speak PostgreSQL's side of the protocol (to
//! provoke what the real test server will not), and their certificates.

use std::path::Path;
use std::process::Command;

/// One backend message: `tag`, the length (itself included), `body`.
pub fn backend(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// Runs openssl in `dir`; `args` is split on whitespace. A failure panics
/// with openssl's error output.
pub fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
