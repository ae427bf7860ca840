//! The connection string, parsed once and used for both the replication and
//! the SQL connection.
//!
//! `tokio_postgres::Config` parses both the URL and the key=value form but
//! knows only sslmode disable/prefer/require, no root certificate and no
//! `require_auth`. We take our own keys out first (sslmode, sslrootcert, the
//! client-certificate keys, which we refuse, `channel_binding` and
//! `require_auth`), hand the rest to tokio-postgres, and keep our settings
//! beside it. TLS itself is done by our transport for both connections (see
//! `tls.rs`, `connect.rs`), so the two always agree; so is the authentication
//! policy (`auth.rs`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use tokio_postgres::config::{Host, SslNegotiation};

use super::error::PgError;
pub use super::sslmode::SslMode;

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, PgError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(PgError::Config {
                    key: "sslmode".into(),
                    message: format!(
                        "{other:?} is not supported; use disable, prefer, require, verify-ca or verify-full"
                    ),
                });
            }
        })
    }
}

/// TLS settings taken from the connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// Default `prefer`, as in libpq.
    pub mode: SslMode,
    /// PEM file with the trusted root certificate(s); required by verify-ca/verify-full.
    pub root_cert: Option<PathBuf>,
}

/// libpq's `channel_binding`: whether SCRAM binds to the TLS channel
/// (SCRAM-SHA-256-PLUS with `tls-server-end-point`, RFC 5929), proving that
/// the server holding the password verifier is the one that sent the
/// certificate (no man in the middle, even without certificate checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelBinding {
    /// Never bind.
    Disable,
    /// Bind when TLS is in use and the server offers SCRAM-SHA-256-PLUS (default).
    Prefer,
    /// Authentication must be SCRAM-SHA-256-PLUS over TLS; anything else fails.
    Require,
}

/// An authentication method as named by libpq's `require_auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// The server accepted the user without asking for anything (trust).
    None,
    /// Cleartext password.
    Password,
    Md5,
    Gss,
    Sspi,
    ScramSha256,
}

impl AuthMethod {
    const ALL: [AuthMethod; 6] = [
        AuthMethod::None,
        AuthMethod::Password,
        AuthMethod::Md5,
        AuthMethod::Gss,
        AuthMethod::Sspi,
        AuthMethod::ScramSha256,
    ];

    /// The name `require_auth` uses.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::None => "none",
            AuthMethod::Password => "password",
            AuthMethod::Md5 => "md5",
            AuthMethod::Gss => "gss",
            AuthMethod::Sspi => "sspi",
            AuthMethod::ScramSha256 => "scram-sha-256",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// Which methods the server may ask for (libpq 16's `require_auth`):
/// default any; `a,b` only those; `!a,!b` any but those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequireAuth {
    allowed: u8,
}

impl Default for RequireAuth {
    fn default() -> Self {
        RequireAuth { allowed: u8::MAX }
    }
}

impl RequireAuth {
    fn parse(value: &str) -> Result<RequireAuth, PgError> {
        let err = |message: String| PgError::Config {
            key: "require_auth".into(),
            message,
        };
        let (mut listed, mut negated) = (0u8, None);
        for item in value.split(',') {
            let (neg, name) = match item.strip_prefix('!') {
                Some(name) => (true, name),
                None => (false, item),
            };
            if *negated.get_or_insert(neg) != neg {
                return Err(err(format!(
                    "{value:?} mixes required and negated (!) methods; list only methods to allow, or only methods to refuse"
                )));
            }
            let method = AuthMethod::ALL
                .into_iter()
                .find(|m| m.name() == name)
                .ok_or_else(|| {
                    err(format!(
                        "unknown method {name:?}; use none, password, md5, gss, sspi or scram-sha-256, optionally with ! to refuse it"
                    ))
                })?;
            if listed & method.bit() != 0 {
                return Err(err(format!("{name:?} is listed twice in {value:?}")));
            }
            listed |= method.bit();
        }
        let allowed = if negated == Some(true) {
            !listed
        } else {
            listed
        };
        Ok(RequireAuth { allowed })
    }

    /// Whether the server may authenticate us with `method`.
    pub fn allows(self, method: AuthMethod) -> bool {
        self.allowed & method.bit() != 0
    }

    /// The allowed methods, as `require_auth` names them.
    pub fn allowed_names(self) -> String {
        let names: Vec<&str> = AuthMethod::ALL
            .into_iter()
            .filter(|m| self.allows(*m))
            .map(AuthMethod::name)
            .collect();
        names.join(",")
    }
}

/// How the client lets the server authenticate it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthSettings {
    /// Default `prefer`, as in libpq.
    pub channel_binding: ChannelBinding,
    /// Default: any method.
    pub require_auth: RequireAuth,
}

/// A parsed connection string.
#[derive(Clone)]
pub struct PgConnectConfig {
    tokio: tokio_postgres::Config,
    tls: TlsSettings,
    auth: AuthSettings,
    session_attrs: SessionAttrs,
}

impl fmt::Debug for PgConnectConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The keys we parse ourselves (tokio-postgres does not get them).
const OWN_KEYS: [&str; 7] = [
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "channel_binding",
    "require_auth",
    "target_session_attrs",
];

/// libpq's `target_session_attrs`: which server of a multi-host list a
/// connection stays on. Hosts are tried in order; one of the wrong kind is
/// passed over like an unreachable one, so after a failover the connector
/// finds the promoted primary by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionAttrs {
    #[default]
    Any,
    /// `transaction_read_only` is off.
    ReadWrite,
    ReadOnly,
    /// Not in recovery.
    Primary,
    /// In recovery (a hot standby).
    Standby,
    /// A standby if any answers, else any server.
    PreferStandby,
}

/// What a session reached, as [`SessionAttrs`] judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerKind {
    pub in_recovery: bool,
    pub read_only: bool,
}

impl ServerKind {
    /// The query that tells, one row: `pg_is_in_recovery`, `transaction_read_only`.
    pub(crate) const QUERY: &'static str =
        "SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only')";

    /// From the query's two text columns.
    pub(crate) fn from_text(in_recovery: &str, read_only: &str) -> ServerKind {
        ServerKind {
            in_recovery: in_recovery == "true",
            read_only: read_only == "on",
        }
    }

    pub fn describe(&self) -> &'static str {
        match (self.in_recovery, self.read_only) {
            (true, _) => "a standby (in recovery)",
            (false, true) => "a read-only primary",
            (false, false) => "a read-write primary",
        }
    }
}

impl SessionAttrs {
    fn parse(value: &str) -> Result<SessionAttrs, PgError> {
        Ok(match value {
            "any" => SessionAttrs::Any,
            "read-write" => SessionAttrs::ReadWrite,
            "read-only" => SessionAttrs::ReadOnly,
            "primary" => SessionAttrs::Primary,
            "standby" => SessionAttrs::Standby,
            "prefer-standby" => SessionAttrs::PreferStandby,
            other => {
                return Err(PgError::Config {
                    key: "target_session_attrs".into(),
                    message: format!(
                        "{other:?} is not one of any, read-write, read-only, primary, standby, prefer-standby"
                    ),
                });
            }
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Primary => "primary",
            SessionAttrs::Standby => "standby",
            SessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// The passes over the host list: prefer-standby first looks for a
    /// standby, then takes any server.
    pub(crate) fn passes(self) -> &'static [SessionAttrs] {
        match self {
            SessionAttrs::PreferStandby => &[SessionAttrs::Standby, SessionAttrs::Any],
            SessionAttrs::Any => &[SessionAttrs::Any],
            SessionAttrs::ReadWrite => &[SessionAttrs::ReadWrite],
            SessionAttrs::ReadOnly => &[SessionAttrs::ReadOnly],
            SessionAttrs::Primary => &[SessionAttrs::Primary],
            SessionAttrs::Standby => &[SessionAttrs::Standby],
        }
    }

    /// Whether the server's kind must be asked after the session started.
    pub(crate) fn needs_check(self) -> bool {
        self != SessionAttrs::Any
    }

    /// Whether a server of `kind` fits (`None`: not asked, fits only `any`).
    pub(crate) fn accepts(self, kind: Option<ServerKind>) -> bool {
        match (self, kind) {
            (SessionAttrs::Any, _) => true,
            (_, None) => false,
            (SessionAttrs::ReadWrite, Some(k)) => !k.read_only,
            (SessionAttrs::ReadOnly, Some(k)) => k.read_only,
            (SessionAttrs::Primary, Some(k)) => !k.in_recovery,
            (SessionAttrs::Standby | SessionAttrs::PreferStandby, Some(k)) => k.in_recovery,
        }
    }
}

impl PgConnectConfig {
    /// Parses a `postgres://` URL or a libpq key=value string. A missing user
    /// or password is taken from `PGUSER` / `PGPASSWORD`.
    pub fn parse(s: &str) -> Result<PgConnectConfig, PgError> {
        Self::parse_with_env(s, |k| std::env::var(k).ok())
    }

    /// [`parse`](Self::parse) with the environment supplied by the caller.
    pub fn parse_with_env(
        s: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<PgConnectConfig, PgError> {
        let (rest, own_pairs) = if is_url(s) {
            split_url(s)?
        } else {
            split_key_values(s)?
        };
        let mut tokio = tokio_postgres::Config::from_str(&rest).map_err(|e| PgError::Config {
            key: "connection string".into(),
            message: e.to_string(),
        })?;

        let mut tls = TlsSettings {
            mode: SslMode::Prefer,
            root_cert: None,
        };
        let mut auth = AuthSettings {
            channel_binding: ChannelBinding::Prefer,
            require_auth: RequireAuth::default(),
        };
        let mut session_attrs = SessionAttrs::Any;
        for (key, value) in own_pairs {
            match key.as_str() {
                "target_session_attrs" => session_attrs = SessionAttrs::parse(&value)?,
                "sslmode" => tls.mode = SslMode::parse(&value)?,
                "sslrootcert" => tls.root_cert = Some(PathBuf::from(value)),
                "channel_binding" => {
                    auth.channel_binding = match value.as_str() {
                        "disable" => ChannelBinding::Disable,
                        "prefer" => ChannelBinding::Prefer,
                        "require" => ChannelBinding::Require,
                        other => {
                            return Err(PgError::Config {
                                key,
                                message: format!(
                                    "{other:?} is not supported; use disable, prefer or require"
                                ),
                            });
                        }
                    }
                }
                "require_auth" => auth.require_auth = RequireAuth::parse(&value)?,
                _ => {
                    return Err(PgError::Config {
                        key,
                        message: "client certificates are not supported".into(),
                    });
                }
            }
        }
        if matches!(tls.mode, SslMode::VerifyCa | SslMode::VerifyFull) && tls.root_cert.is_none() {
            return Err(PgError::Config {
                key: "sslrootcert".into(),
                message: format!(
                    "sslmode={} needs sslrootcert=<PEM file with the trusted CA>",
                    tls.mode
                ),
            });
        }
        if tokio.get_ssl_negotiation() == SslNegotiation::Direct {
            return Err(PgError::Config {
                key: "sslnegotiation".into(),
                message: "only sslnegotiation=postgres is supported".into(),
            });
        }
        if auth.channel_binding == ChannelBinding::Require {
            if tls.mode == SslMode::Disable {
                return Err(PgError::Config {
                    key: "channel_binding".into(),
                    message:
                        "channel_binding=require needs TLS, but sslmode=disable never uses it: \
                              set sslmode=require (or verify-full)"
                            .into(),
                });
            }
            if !auth.require_auth.allows(AuthMethod::ScramSha256) {
                return Err(PgError::Config {
                    key: "channel_binding".into(),
                    message: format!(
                        "channel_binding=require needs SCRAM-SHA-256, which require_auth={} refuses",
                        auth.require_auth.allowed_names()
                    ),
                });
            }
        }
        tokio.channel_binding(match auth.channel_binding {
            ChannelBinding::Disable => tokio_postgres::config::ChannelBinding::Disable,
            ChannelBinding::Prefer => tokio_postgres::config::ChannelBinding::Prefer,
            ChannelBinding::Require => tokio_postgres::config::ChannelBinding::Require,
        });
        tokio.ssl_mode(match tls.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });

        if tokio.get_user().is_none() {
            match env("PGUSER") {
                Some(user) if !user.is_empty() => {
                    tokio.user(user);
                }
                _ => {
                    return Err(PgError::Config {
                        key: "user".into(),
                        message: "no user in the connection string and PGUSER is not set".into(),
                    });
                }
            }
        }
        if tokio.get_password().is_none()
            && let Some(pw) = env("PGPASSWORD")
        {
            tokio.password(pw);
        }
        if tokio.get_hosts().is_empty() {
            return Err(PgError::Config {
                key: "host".into(),
                message: "no host in the connection string".into(),
            });
        }
        let (hosts, ports) = (tokio.get_hosts().len(), tokio.get_ports().len());
        if ports > 1 && ports != hosts {
            return Err(PgError::Config {
                key: "port".into(),
                message: format!("{ports} ports for {hosts} hosts"),
            });
        }
        Ok(PgConnectConfig {
            tokio,
            tls,
            auth,
            session_attrs,
        })
    }

    pub fn tokio_config(&self) -> &tokio_postgres::Config {
        &self.tokio
    }

    pub fn tls(&self) -> &TlsSettings {
        &self.tls
    }

    pub fn auth(&self) -> &AuthSettings {
        &self.auth
    }

    pub fn session_attrs(&self) -> SessionAttrs {
        self.session_attrs
    }

    /// The user name (always present after parsing).
    pub fn user(&self) -> &str {
        self.tokio.get_user().unwrap_or_default()
    }

    /// The database name; PostgreSQL defaults it to the user name.
    pub fn dbname(&self) -> &str {
        self.tokio.get_dbname().unwrap_or_else(|| self.user())
    }

    pub(crate) fn password(&self) -> Option<&[u8]> {
        self.tokio.get_password()
    }

    /// `(host, port)` pairs in the order they are tried.
    pub(crate) fn endpoints(&self) -> Vec<(Host, u16)> {
        let ports = self.tokio.get_ports();
        self.tokio
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let port = match ports.len() {
                    0 => 5432,
                    1 => ports[0],
                    _ => ports[i],
                };
                (h.clone(), port)
            })
            .collect()
    }

    /// A description for logs: user, hosts, database and sslmode; never the password.
    pub fn redacted(&self) -> String {
        let hosts: Vec<String> = self
            .endpoints()
            .iter()
            .map(|(h, p)| endpoint_name(h, *p))
            .collect();
        format!(
            "postgres://{}@{}/{}?sslmode={}",
            self.user(),
            hosts.join(","),
            self.dbname(),
            self.tls.mode
        )
    }
}

/// `host:port`, or the socket path for a Unix socket.
pub(crate) fn endpoint_name(host: &Host, port: u16) -> String {
    match host {
        Host::Tcp(h) if h.contains(':') => format!("[{h}]:{port}"),
        Host::Tcp(h) => format!("{h}:{port}"),
        #[cfg(unix)]
        Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
    }
}

fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

type OwnPairs = Vec<(String, String)>;

/// Removes our own parameters ([`OWN_KEYS`]) from a URL's query string.
fn split_url(s: &str) -> Result<(String, OwnPairs), PgError> {
    let s = &encode_late_at_signs(s);
    let Some((base, query)) = s.split_once('?') else {
        return Ok((s.to_owned(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut own = Vec::new();
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = param.split_once('=').unwrap_or((param, ""));
        let key = percent_decode(k, "URL parameter name")?;
        if OWN_KEYS.contains(&key.as_str()) {
            own.push((key.clone(), percent_decode(v, &key)?));
        } else {
            kept.push(param);
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, own))
}

/// libpq reads a URL's user info up to an `@` before the first `/` after
/// the scheme, tokio-postgres up to the first `@` anywhere: with none before
/// that `/`, an `@` after it (in the database name or a parameter, such as a
/// password) would become tokio-postgres' user and password. Encoded, it is
/// read as libpq reads it.
fn encode_late_at_signs(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.to_owned();
    };
    let slash = rest.find('/').unwrap_or(rest.len());
    if rest[..slash].contains('@') {
        return s.to_owned();
    }
    let (authority, path) = rest.split_at(slash);
    format!("{scheme}://{authority}{}", path.replace('@', "%40"))
}

fn percent_decode(s: &str, key: &str) -> Result<String, PgError> {
    let bad = || PgError::Config {
        key: key.to_owned(),
        message: "invalid percent-encoding".into(),
    };
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Tokenizes libpq's `key = value` form (values unquoted, or single-quoted
/// with backslash escapes), removes our own keys and re-emits the rest quoted.
fn split_key_values(s: &str) -> Result<(String, OwnPairs), PgError> {
    let mut kept = String::new();
    let mut own = Vec::new();
    let mut chars = s.chars().peekable();
    let err = |message: &str| PgError::Config {
        key: "connection string".into(),
        message: message.to_owned(),
    };
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(err(&format!("expected '=' after {key:?}")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(err(&format!("unterminated quoted value for {key:?}"))),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if OWN_KEYS.contains(&key.as_str()) {
            own.push((key, value));
        } else {
            let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push_str(&format!("{key}='{quoted}' "));
        }
    }
    Ok((kept, own))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_without_env(s: &str) -> Result<PgConnectConfig, PgError> {
        PgConnectConfig::parse_with_env(s, |_| None)
    }

    #[test]
    fn parses_url_with_tls_keys() {
        let c = parse_without_env("postgres://outbox:s3cret@127.0.0.1:54329/app?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x")
        .unwrap();
        assert_eq!(c.tls().mode, SslMode::VerifyFull);
        assert_eq!(c.tls().root_cert, Some(PathBuf::from("/tmp/ca.pem")));
        assert_eq!(c.user(), "outbox");
        assert_eq!(c.password(), Some(&b"s3cret"[..]));
        assert_eq!(c.dbname(), "app");
        assert_eq!(c.tokio_config().get_application_name(), Some("x"));
        assert_eq!(
            c.tokio_config().get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(
            c.redacted(),
            "postgres://outbox@127.0.0.1:54329/app?sslmode=verify-full"
        );
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn parses_key_value_form() {
        let c = parse_without_env(
            r"host=127.0.0.1 port = 5433 user=u password='it''s' dbname='my db' sslmode=verify-ca sslrootcert='/a b/ca.pem'",
        );
        // libpq does not double quotes inside quoted values; backslash escapes them.
        assert!(c.is_err());
        let c = parse_without_env(r"host=127.0.0.1 port = 5433 user=u password='it\'s \\ x' dbname='my db' sslmode=verify-ca sslrootcert='/a b/ca.pem'")
        .unwrap();
        assert_eq!(c.password(), Some(&br"it's \ x"[..]));
        assert_eq!(c.dbname(), "my db");
        assert_eq!(c.tls().mode, SslMode::VerifyCa);
        assert_eq!(c.tls().root_cert, Some(PathBuf::from("/a b/ca.pem")));
        assert_eq!(c.endpoints().len(), 1);
        assert_eq!(
            c.redacted(),
            "postgres://u@127.0.0.1:5433/my db?sslmode=verify-ca"
        );
    }

    /// A2: libpq ends the user info at the first `/`; an `@` in a parameter
    /// after it (here in the password) is not one, and the description for
    /// logs never shows the password.
    #[test]
    fn an_at_sign_after_the_path_is_no_user_info() {
        let c = parse_without_env("postgres://h/db?user=u&password=hunter2@x").unwrap();
        assert_eq!(c.password(), Some(&b"hunter2@x"[..]));
        assert_eq!(c.user(), "u");
        assert_eq!(c.redacted(), "postgres://u@h:5432/db?sslmode=prefer");
        let c = parse_without_env("postgres://u:pw@h/db?application_name=a@b").unwrap();
        assert_eq!(c.user(), "u");
        assert_eq!(c.password(), Some(&b"pw"[..]));
        assert_eq!(c.tokio_config().get_application_name(), Some("a@b"));
    }

    #[test]
    fn defaults_and_env_fallbacks() {
        let env = |k: &str| match k {
            "PGPASSWORD" => Some("from-env".to_owned()),
            "PGUSER" => Some("envuser".to_owned()),
            _ => None,
        };
        let c = PgConnectConfig::parse_with_env("postgres://127.0.0.1/db", env).unwrap();
        assert_eq!(c.tls().mode, SslMode::Prefer);
        assert_eq!(c.user(), "envuser");
        assert_eq!(c.password(), Some(&b"from-env"[..]));
        assert_eq!(c.endpoints()[0].1, 5432);
        // A password in the URL wins over the environment.
        let c = PgConnectConfig::parse_with_env("postgres://a:b@127.0.0.1/db", env).unwrap();
        assert_eq!(c.password(), Some(&b"b"[..]));
    }

    #[test]
    fn parses_channel_binding_and_require_auth() {
        let c = parse_without_env("postgres://u@h/db").unwrap();
        assert_eq!(c.auth().channel_binding, ChannelBinding::Prefer);
        assert_eq!(c.auth().require_auth, RequireAuth::default());
        let c = parse_without_env(
            "postgres://u@h/db?sslmode=require&channel_binding=require&require_auth=scram-sha-256",
        )
        .unwrap();
        assert_eq!(c.auth().channel_binding, ChannelBinding::Require);
        assert_eq!(
            c.tokio_config().get_channel_binding(),
            tokio_postgres::config::ChannelBinding::Require
        );
        let ra = c.auth().require_auth;
        assert!(ra.allows(AuthMethod::ScramSha256));
        for m in [AuthMethod::Password, AuthMethod::Md5, AuthMethod::None] {
            assert!(!ra.allows(m), "{m:?}");
        }
        let c = parse_without_env(
            "host=h user=u channel_binding=disable require_auth='!password,!md5'",
        )
        .unwrap();
        assert_eq!(c.auth().channel_binding, ChannelBinding::Disable);
        assert_eq!(
            c.auth().require_auth.allowed_names(),
            "none,gss,sspi,scram-sha-256"
        );
    }

    #[test]
    fn rejects_bad_settings_naming_the_key() {
        let key_of = |s: &str| match parse_without_env(s) {
            Err(PgError::Config { key, .. }) => key,
            other => panic!("expected a config error for {s}, got {other:?}"),
        };
        assert_eq!(key_of("postgres://u@h/db?sslmode=allow"), "sslmode");
        assert_eq!(key_of("postgres://u@h/db?sslmode=verify-ca"), "sslrootcert");
        assert_eq!(key_of("postgres://u@h/db?sslcert=/c.pem"), "sslcert");
        assert_eq!(key_of("postgres://h/db"), "user");
        assert_eq!(key_of("user=u"), "host");
        assert_eq!(key_of("host=h user=u bogus=1"), "connection string");
        assert_eq!(key_of("host=h user"), "connection string");
        assert_eq!(key_of("postgres://u@h/db?sslrootcert=%zz"), "sslrootcert");
        assert_eq!(
            key_of("postgres://u@h/db?channel_binding=yes"),
            "channel_binding"
        );
        assert_eq!(
            key_of("postgres://u@h/db?sslmode=disable&channel_binding=require"),
            "channel_binding"
        );
        assert_eq!(
            key_of("postgres://u@h/db?channel_binding=require&require_auth=md5"),
            "channel_binding"
        );
        for bad in ["scram", "md5,!password", "md5,md5", ""] {
            assert_eq!(
                key_of(&format!("postgres://u@h/db?require_auth={bad}")),
                "require_auth",
                "{bad}"
            );
        }
    }
}
