//! libpq's `sslmode` values (the parsing is in `config`): below `error`,
//! whose TLS errors name the mode.

use std::fmt;

/// libpq's sslmode values that we implement (`allow` is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, without certificate checks; plain otherwise.
    Prefer,
    /// TLS or fail, without certificate checks (encryption only).
    Require,
    /// TLS, chain verified against `sslrootcert`; the host name is not checked.
    VerifyCa,
    /// TLS, chain verified against `sslrootcert` and the host name matched.
    VerifyFull,
}

impl SslMode {
    /// Whether a server without TLS is an error.
    pub fn requires_tls(self) -> bool {
        !matches!(self, SslMode::Disable | SslMode::Prefer)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}
