//! The client side of PostgreSQL authentication as a pure state machine:
//! one AuthenticationRequest body in, the reply (if any) appended to a buffer.
//!
//! Methods: trust (AuthenticationOk at once), cleartext password (code 3),
//! md5 (code 5: `"md5" + md5(md5(password + user) + salt)` in hex), and
//! SCRAM-SHA-256 (codes 10/11/12), with channel binding
//! (SCRAM-SHA-256-PLUS, `tls-server-end-point`) over TLS per `channel_binding`.
//!
//! SCRAM authenticates both sides: the server proves it knows the password
//! verifier with its signature in AuthenticationSASLFinal. An
//! AuthenticationOk before a verified SASLFinal is refused, or a man in the
//! middle could skip that proof and impersonate the database. `require_auth`
//! refuses methods the user did not allow before any password is sent.
//!
//! A server asks for one method per login and then only continues it:
//! PostgreSQL sends one request (cleartext, md5 or SASL), then SASLContinue
//! and SASLFinal for SCRAM, then AuthenticationOk or an error. Every request
//! is checked, not only the first (libpq's `check_expected_areq` does the
//! same): a second method request is refused before it is answered, or a man
//! in the middle could start SCRAM to pass the first check and then ask for
//! the password in clear. After a refusal nothing more is answered.

use bytes::{Bytes, BytesMut};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding, SCRAM_SHA_256, SCRAM_SHA_256_PLUS, ScramSha256,
};

use super::config::{AuthMethod, AuthSettings, ChannelBinding as BindingMode};
use super::error::PgError;
use super::wire::{Reader, WireError, encode, tag};

/// A parsed AuthenticationRequest ('R') body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AuthRequest {
    Ok,
    Cleartext,
    Md5 {
        salt: [u8; 4],
    },
    Sasl {
        mechanisms: Vec<String>,
    },
    SaslContinue(Bytes),
    SaslFinal(Bytes),
    /// Kerberos, GSSAPI, SSPI...: the code PostgreSQL sent.
    Other(i32),
}

impl AuthRequest {
    /// The protocol's name for the request, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            AuthRequest::Ok => "AuthenticationOk",
            AuthRequest::Cleartext => "AuthenticationCleartextPassword",
            AuthRequest::Md5 { .. } => "AuthenticationMD5Password",
            AuthRequest::Sasl { .. } => "AuthenticationSASL",
            AuthRequest::SaslContinue(_) => "AuthenticationSASLContinue",
            AuthRequest::SaslFinal(_) => "AuthenticationSASLFinal",
            AuthRequest::Other(2) => "AuthenticationKerberosV5",
            AuthRequest::Other(7) => "AuthenticationGSS",
            AuthRequest::Other(8) => "AuthenticationGSSContinue",
            AuthRequest::Other(9) => "AuthenticationSSPI",
            AuthRequest::Other(_) => "an AuthenticationRequest of an unknown code",
        }
    }

    /// The method a first request asks for, in `require_auth`'s terms
    /// (`None` for SASL continuation messages, which are not a first request).
    pub fn method(&self) -> Option<AuthMethod> {
        Some(match self {
            AuthRequest::Ok => AuthMethod::None,
            AuthRequest::Cleartext => AuthMethod::Password,
            AuthRequest::Md5 { .. } => AuthMethod::Md5,
            AuthRequest::Sasl { .. } => AuthMethod::ScramSha256,
            AuthRequest::Other(7 | 8) => AuthMethod::Gss,
            AuthRequest::Other(9) => AuthMethod::Sspi,
            AuthRequest::SaslContinue(_) | AuthRequest::SaslFinal(_) | AuthRequest::Other(_) => {
                return None;
            }
        })
    }

    pub fn parse(body: &Bytes) -> Result<AuthRequest, WireError> {
        let mut r = Reader::new(tag::AUTHENTICATION, body);
        let code = r.i32("authentication code")?;
        let req = match code {
            0 => AuthRequest::Ok,
            3 => AuthRequest::Cleartext,
            5 => {
                let salt = r.bytes(4, "md5 salt")?;
                AuthRequest::Md5 {
                    salt: [salt[0], salt[1], salt[2], salt[3]],
                }
            }
            10 => {
                let mut mechanisms = Vec::new();
                loop {
                    let m = r.cstr()?;
                    if m.is_empty() {
                        break;
                    }
                    mechanisms.push(m.to_owned());
                }
                AuthRequest::Sasl { mechanisms }
            }
            11 => AuthRequest::SaslContinue(r.rest()),
            12 => AuthRequest::SaslFinal(r.rest()),
            other => {
                r.rest();
                AuthRequest::Other(other)
            }
        };
        r.finish()?;
        Ok(req)
    }
}

/// Why authentication failed on our side (the server's refusals arrive as
/// ErrorResponse and are mapped by the connection).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthError {
    #[error(
        "the server asks for a password ({method}) but none is configured (password in the URL or PGPASSWORD)"
    )]
    NoPassword { method: &'static str },
    #[error("the server asks for {method}, which is not supported")]
    Unsupported { method: String },
    #[error("the server offers SASL mechanisms {offered:?}, none of which is SCRAM-SHA-256")]
    NoScram { offered: Vec<String> },
    #[error("SCRAM exchange failed: {0}")]
    Scram(std::io::Error),
    #[error("the server sent {request} {why}: refused")]
    OutOfOrder { request: &'static str, why: String },
    #[error(
        "the server sent {request} after it had asked for {chosen} authentication: refused before answering it{also}. A server asks for one method per login and then only continues it; a man in the middle may be trying to downgrade the login to obtain the password"
    )]
    SecondMethod {
        request: &'static str,
        chosen: &'static str,
        /// The setting that refuses the request's method as well, if any:
        /// " (password authentication, which require_auth=... refuses anyway)".
        also: String,
    },
    #[error(
        "the server accepted the login before proving it knows the password (no verified SCRAM server signature): refusing, a man in the middle may be impersonating the database"
    )]
    ServerNotVerified,
    #[error(
        "the server asks for {method} authentication, which require_auth={allowed} refuses: allow it in require_auth, or change the server's pg_hba.conf to a method you allow (scram-sha-256)"
    )]
    MethodRefused {
        method: &'static str,
        allowed: String,
    },
    #[error(
        "channel_binding=require, but {why}: connect with TLS (sslmode=require or verify-full) to a server that offers SCRAM-SHA-256-PLUS (password_encryption = scram-sha-256, a SCRAM verifier), or set channel_binding=prefer"
    )]
    BindingRequired { why: String },
    #[error(transparent)]
    Encode(PgError),
}

/// Where a SCRAM exchange stands.
enum Scram {
    NotStarted,
    Running(ScramSha256),
    /// The server's signature was verified.
    Verified,
}

/// Progress of one authentication exchange.
pub(crate) struct Authenticator {
    user: String,
    password: Option<Vec<u8>>,
    settings: AuthSettings,
    /// `tls-server-end-point` data of the TLS session, when there is one and
    /// the server certificate's signature algorithm defines it.
    end_point: Option<Vec<u8>>,
    /// The method of the first request, once seen: from then on only its
    /// continuation is answered.
    method: Option<AuthMethod>,
    scram: Scram,
    bound: bool,
    /// A step was refused: the exchange is over.
    refused: bool,
}

impl Authenticator {
    pub fn new(
        user: &str,
        password: Option<&[u8]>,
        settings: AuthSettings,
        end_point: Option<Vec<u8>>,
    ) -> Authenticator {
        Authenticator {
            user: user.to_owned(),
            password: password.map(<[u8]>::to_vec),
            settings,
            end_point,
            method: None,
            scram: Scram::NotStarted,
            bound: false,
            refused: false,
        }
    }

    /// `require_auth` and `channel_binding` against every request that asks
    /// for a method; only the first such request may choose one.
    /// Continuations are checked against the chosen method in `answer`.
    fn admit(&mut self, req: &AuthRequest) -> Result<(), AuthError> {
        let Some(method) = req.method() else {
            return Ok(());
        };
        // AuthenticationOk ends the chosen method's exchange (`answer` checks
        // that it finished); first, it means trust.
        if *req == AuthRequest::Ok && self.method.is_some() {
            return Ok(());
        }
        let allowed = check_method(self.settings, method);
        match self.method {
            None => {
                allowed?;
                self.method = Some(method);
                Ok(())
            }
            Some(chosen) => Err(AuthError::SecondMethod {
                request: req.name(),
                chosen: chosen.name(),
                also: match allowed {
                    Ok(()) => String::new(),
                    Err(AuthError::MethodRefused { method, allowed }) => {
                        format!(
                            " ({method} authentication, which require_auth={allowed} refuses anyway)"
                        )
                    }
                    Err(_) => format!(
                        " ({} authentication, which channel_binding=require refuses anyway: it cannot bind to the channel)",
                        method.name()
                    ),
                },
            }),
        }
    }

    fn password(&self, method: &'static str) -> Result<&[u8], AuthError> {
        self.password
            .as_deref()
            .ok_or(AuthError::NoPassword { method })
    }

    /// Handles one request; appends any reply to `out`. Returns `true` once
    /// the server has accepted us (AuthenticationOk). On an error nothing is
    /// appended, and every later request is refused.
    pub fn step(&mut self, req: AuthRequest, out: &mut BytesMut) -> Result<bool, AuthError> {
        if self.refused {
            return Err(AuthError::OutOfOrder {
                request: req.name(),
                why: "after authentication was refused".into(),
            });
        }
        let len = out.len();
        let answered = self.answer(req, out);
        if answered.is_err() {
            out.truncate(len);
            self.refused = true;
        }
        answered
    }

    fn answer(&mut self, req: AuthRequest, out: &mut BytesMut) -> Result<bool, AuthError> {
        self.admit(&req)?;
        match req {
            AuthRequest::Ok => {
                if self.method == Some(AuthMethod::ScramSha256)
                    && !matches!(self.scram, Scram::Verified)
                {
                    return Err(AuthError::ServerNotVerified);
                }
                if self.settings.channel_binding == BindingMode::Require && !self.bound {
                    return Err(AuthError::BindingRequired {
                        why: "the server accepted the login without channel binding".into(),
                    });
                }
                return Ok(true);
            }
            AuthRequest::Cleartext => {
                let pw = self.password("cleartext password")?.to_vec();
                encode::password(&pw, out).map_err(AuthError::Encode)?;
            }
            AuthRequest::Md5 { salt } => {
                let hash = md5_hash(self.user.as_bytes(), self.password("md5")?, salt);
                encode::password(hash.as_bytes(), out).map_err(AuthError::Encode)?;
            }
            AuthRequest::Sasl { mechanisms } => {
                let offers = |name: &str| mechanisms.iter().any(|m| m == name);
                let mode = self.settings.channel_binding;
                let end_point = self
                    .end_point
                    .clone()
                    .filter(|_| mode != BindingMode::Disable);
                // The gs2 header tells the server what we could do: `p=` binds;
                // `y` (we could bind, the server did not offer it) lets a server
                // that does offer PLUS detect a downgrade; `n` without TLS data.
                let (mechanism, binding) = match end_point {
                    Some(data) if offers(SCRAM_SHA_256_PLUS) => (
                        SCRAM_SHA_256_PLUS,
                        ChannelBinding::tls_server_end_point(data),
                    ),
                    Some(_) if offers(SCRAM_SHA_256) => {
                        (SCRAM_SHA_256, ChannelBinding::unrequested())
                    }
                    None if offers(SCRAM_SHA_256) => (SCRAM_SHA_256, ChannelBinding::unsupported()),
                    _ => {
                        return Err(AuthError::NoScram {
                            offered: mechanisms,
                        });
                    }
                };
                if mode == BindingMode::Require && mechanism != SCRAM_SHA_256_PLUS {
                    return Err(AuthError::BindingRequired {
                        why: if self.end_point.is_none() {
                            "the connection has no TLS channel to bind to (no TLS, or a server certificate without a tls-server-end-point hash)".into()
                        } else {
                            format!("the server offers only {mechanisms:?}")
                        },
                    });
                }
                let scram = ScramSha256::new(self.password("SCRAM-SHA-256")?, binding);
                encode::sasl_initial(mechanism, scram.message(), out).map_err(AuthError::Encode)?;
                self.bound = mechanism == SCRAM_SHA_256_PLUS;
                self.scram = Scram::Running(scram);
            }
            AuthRequest::SaslContinue(data) => {
                let Scram::Running(scram) = &mut self.scram else {
                    return Err(self.not_in_scram("AuthenticationSASLContinue"));
                };
                scram.update(&data).map_err(AuthError::Scram)?;
                encode::sasl_response(scram.message(), out).map_err(AuthError::Encode)?;
            }
            AuthRequest::SaslFinal(data) => {
                let Scram::Running(scram) = &mut self.scram else {
                    return Err(self.not_in_scram("AuthenticationSASLFinal"));
                };
                // Verifies the server signature (postgres-protocol's `finish`
                // checks it against the ServerKey derived from the password):
                // a server that does not know the password cannot pass.
                scram.finish(&data).map_err(AuthError::Scram)?;
                self.scram = Scram::Verified;
            }
            AuthRequest::Other(code) => {
                return Err(AuthError::Unsupported {
                    method: match code {
                        2 => "Kerberos V5".to_owned(),
                        7 | 8 => "GSSAPI".to_owned(),
                        9 => "SSPI".to_owned(),
                        other => format!("authentication code {other}"),
                    },
                });
            }
        }
        Ok(false)
    }

    /// A SCRAM continuation while no SCRAM exchange runs.
    fn not_in_scram(&self, request: &'static str) -> AuthError {
        AuthError::OutOfOrder {
            request,
            why: match (&self.scram, self.method) {
                (Scram::Verified, _) => "after the SCRAM exchange had completed".into(),
                (_, None) => "before any AuthenticationSASL started a SCRAM exchange".into(),
                (_, Some(method)) => format!(
                    "although the server had asked for {} authentication, not SCRAM",
                    method.name()
                ),
            },
        }
    }
}

/// The checks of [`check_method`] plus, for a SASL request under
/// `channel_binding=require`, that SCRAM-SHA-256-PLUS can be used: what the
/// control connection checks before tokio-postgres answers the first request.
pub(crate) fn check_first_request(
    settings: AuthSettings,
    req: &AuthRequest,
    has_end_point: bool,
) -> Result<(), AuthError> {
    let Some(method) = req.method() else {
        return Ok(());
    };
    check_method(settings, method)?;
    if let AuthRequest::Sasl { mechanisms } = req
        && settings.channel_binding == BindingMode::Require
    {
        if !has_end_point {
            return Err(AuthError::BindingRequired {
                    why: "the connection has no TLS channel to bind to (no TLS, or a server certificate without a tls-server-end-point hash)".into(),
                });
        }
        if !mechanisms.iter().any(|m| m == SCRAM_SHA_256_PLUS) {
            return Err(AuthError::BindingRequired {
                why: format!("the server offers only {mechanisms:?}"),
            });
        }
    }
    Ok(())
}

/// `require_auth` and `channel_binding` against the method a server asks for
/// first; shared by our transport and the tokio-postgres control connection.
pub(crate) fn check_method(settings: AuthSettings, method: AuthMethod) -> Result<(), AuthError> {
    if !settings.require_auth.allows(method) {
        return Err(AuthError::MethodRefused {
            method: method.name(),
            allowed: settings.require_auth.allowed_names(),
        });
    }
    if settings.channel_binding == BindingMode::Require && method != AuthMethod::ScramSha256 {
        return Err(AuthError::BindingRequired {
            why: format!(
                "the server asks for {} authentication, which cannot bind to the channel",
                method.name()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::PgConnectConfig;

    fn settings(params: &str) -> AuthSettings {
        *PgConnectConfig::parse_with_env(&format!("host=h user=u {params}"), |_| None)
            .unwrap()
            .auth()
    }

    fn auth(user: &str, password: Option<&[u8]>) -> Authenticator {
        Authenticator::new(user, password, settings(""), None)
    }

    fn sasl() -> AuthRequest {
        AuthRequest::Sasl {
            mechanisms: vec!["SCRAM-SHA-256-PLUS".into(), "SCRAM-SHA-256".into()],
        }
    }

    /// Starts SCRAM and answers the client-first message with a server-first
    /// message that extends its nonce; returns the client-final message.
    fn scram_to_final(a: &mut Authenticator) -> Vec<u8> {
        let mut out = BytesMut::new();
        a.step(sasl(), &mut out).unwrap();
        let first = String::from_utf8(out[5 + b"SCRAM-SHA-256\0".len() + 4..].to_vec()).unwrap();
        // The nonce is any printable character but ',': it may hold "r=",
        // so it is what follows the first ",r=" (after "n=").
        let nonce = first.split_once(",r=").unwrap().1.to_owned();
        out.clear();
        let server_first = format!("r={nonce}srv,s=c2FsdHNhbHQ=,i=4096");
        a.step(
            AuthRequest::SaslContinue(Bytes::from(server_first)),
            &mut out,
        )
        .unwrap();
        out.to_vec()
    }

    /// HMAC-SHA-256 (RFC 2104) over the concatenated `parts`.
    fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut block = [0u8; 64];
        block[..key.len()].copy_from_slice(key);
        let pad = |byte: u8| block.map(|b| b ^ byte);
        let mut inner = Sha256::new();
        inner.update(pad(0x36));
        for part in parts {
            inner.update(part);
        }
        let mut outer = Sha256::new();
        outer.update(pad(0x5c));
        outer.update(inner.finalize());
        let mut mac = [0u8; 32];
        mac.copy_from_slice(&outer.finalize());
        mac
    }

    fn base64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..4 {
                s.push(match i <= chunk.len() {
                    true => ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char,
                    false => '=',
                });
            }
        }
        s
    }

    /// Plays the server's side of SCRAM-SHA-256 (RFC 5802) for the password
    /// "pw", salt "saltsalt", 4096 iterations, as PostgreSQL does: sends
    /// `sasl` and SASLContinue to `a` and returns the AuthenticationSASLFinal
    /// body a server that knows the password sends (not yet given to `a`).
    fn scram_server(a: &mut Authenticator, sasl: AuthRequest) -> Bytes {
        let mut out = BytesMut::new();
        a.step(sasl, &mut out).unwrap();
        // 'p', length, mechanism, NUL, length, client-first message.
        let body = &out[5..];
        let nul = body.iter().position(|b| *b == 0).unwrap();
        let first = std::str::from_utf8(&body[nul + 5..]).unwrap().to_owned();
        let bare = first.splitn(3, ',').nth(2).unwrap().to_owned();
        // The nonce is any printable character but ',': it may hold "r=",
        // so it is what follows the first ",r=" (after "n=").
        let nonce = bare.split_once(",r=").unwrap().1.to_owned();
        let server_first = format!("r={nonce}srv,s={},i=4096", base64(b"saltsalt"));
        out.clear();
        a.step(
            AuthRequest::SaslContinue(Bytes::from(server_first.clone())),
            &mut out,
        )
        .unwrap();
        let last = std::str::from_utf8(&out[5..]).unwrap();
        let without_proof = last.rsplit_once(",p=").unwrap().0;
        // Hi(password, salt, i) = U1 ^ ... ^ Ui, U1 = HMAC(password, salt + INT(1)).
        let mut u = hmac(b"pw", &[b"saltsalt", &1u32.to_be_bytes()]);
        let mut salted = u;
        for _ in 1..4096 {
            u = hmac(b"pw", &[&u]);
            salted.iter_mut().zip(u).for_each(|(s, u)| *s ^= u);
        }
        let server_key = hmac(&salted, &[b"Server Key"]);
        let auth_message = format!("{bare},{server_first},{without_proof}");
        let signature = hmac(&server_key, &[auth_message.as_bytes()]);
        Bytes::from(format!("v={}", base64(&signature)))
    }

    /// The settings of the audit's scenario (F4): SCRAM only, bound to TLS.
    fn scram_plus_only() -> AuthSettings {
        settings("sslmode=require require_auth=scram-sha-256 channel_binding=require")
    }

    fn tls_end_point() -> Option<Vec<u8>> {
        Some(vec![7u8; 32])
    }

    #[test]
    fn a_full_scram_exchange_with_channel_binding_is_accepted() {
        let mut a = Authenticator::new("u", Some(b"pw"), scram_plus_only(), tls_end_point());
        let last = scram_server(&mut a, sasl());
        let mut out = BytesMut::new();
        assert!(!a.step(AuthRequest::SaslFinal(last), &mut out).unwrap());
        assert!(a.step(AuthRequest::Ok, &mut out).unwrap());
        assert!(out.is_empty());
        // The same without channel binding, under the default settings.
        let mut a = auth("u", Some(b"pw"));
        let last = scram_server(&mut a, sasl());
        a.step(AuthRequest::SaslFinal(last), &mut out).unwrap();
        assert!(a.step(AuthRequest::Ok, &mut out).unwrap());
    }

    /// The audit's F4: a man in the middle answers AuthenticationSASL
    /// [SCRAM-SHA-256-PLUS], then asks for the password in clear.
    #[test]
    fn a_cleartext_request_after_sasl_is_refused_before_the_password_is_sent() {
        for (params, end_point) in [
            (
                "sslmode=require require_auth=scram-sha-256 channel_binding=require",
                tls_end_point(),
            ),
            ("", tls_end_point()),
            ("", None),
        ] {
            let mut a = Authenticator::new("u", Some(b"pw"), settings(params), end_point);
            let mut out = BytesMut::new();
            a.step(sasl(), &mut out).unwrap();
            out.clear();
            let e = a
                .step(AuthRequest::Cleartext, &mut out)
                .expect_err(&format!("{params:?}: cleartext after SASL must be refused"));
            assert!(out.is_empty(), "{params:?}: nothing sent, got {out:?}");
            let msg = e.to_string();
            for part in [
                "AuthenticationCleartextPassword",
                "scram-sha-256",
                "man in the middle",
            ] {
                assert!(msg.contains(part), "{params:?}: {part:?} in {msg}");
            }
            // Which settings refuse it as well.
            if !params.is_empty() {
                assert!(msg.contains("require_auth=scram-sha-256"), "{msg}");
            }
            // Nothing is answered afterwards either.
            assert!(a.step(AuthRequest::Cleartext, &mut out).is_err());
            assert!(a.step(AuthRequest::Ok, &mut out).is_err());
            assert!(out.is_empty());
        }
    }

    #[test]
    fn an_md5_request_after_sasl_is_refused_before_the_hash_is_sent() {
        for params in [
            "sslmode=require require_auth=scram-sha-256 channel_binding=require",
            "",
        ] {
            let mut a = Authenticator::new("u", Some(b"pw"), settings(params), tls_end_point());
            let mut out = BytesMut::new();
            a.step(sasl(), &mut out).unwrap();
            out.clear();
            let e = a
                .step(AuthRequest::Md5 { salt: [1, 2, 3, 4] }, &mut out)
                .expect_err(&format!("{params:?}: md5 after SASL must be refused"));
            assert!(out.is_empty(), "{params:?}: nothing sent, got {out:?}");
            let msg = e.to_string();
            assert!(msg.contains("AuthenticationMD5Password"), "{msg}");
        }
    }

    /// require_auth=scram-sha-256: a cleartext request is refused whenever it
    /// comes: first, after SASL, after our proof, after the server's proof.
    #[test]
    fn cleartext_is_refused_at_every_step_under_require_auth_scram() {
        let only_scram = settings("require_auth=scram-sha-256");
        let at_step = |steps: usize| {
            let mut a = Authenticator::new("u", Some(b"pw"), only_scram, None);
            match steps {
                0 => {}
                1 => {
                    a.step(sasl(), &mut BytesMut::new()).unwrap();
                }
                2 => {
                    scram_to_final(&mut a);
                }
                _ => {
                    let last = scram_server(&mut a, sasl());
                    a.step(AuthRequest::SaslFinal(last), &mut BytesMut::new())
                        .unwrap();
                }
            }
            a
        };
        for steps in 0..4 {
            for req in [AuthRequest::Cleartext, AuthRequest::Md5 { salt: [0; 4] }] {
                let mut a = at_step(steps);
                let mut out = BytesMut::new();
                let e = a
                    .step(req.clone(), &mut out)
                    .expect_err(&format!("{req:?} after {steps} steps must be refused"));
                assert!(out.is_empty(), "{req:?} after {steps} steps: sent {out:?}");
                assert!(
                    e.to_string().contains("require_auth=scram-sha-256"),
                    "{steps}: {e}"
                );
            }
        }
    }

    #[test]
    fn sasl_continue_or_final_without_a_sasl_start_is_refused() {
        let cont = || AuthRequest::SaslContinue(Bytes::from_static(b"r=x,s=c2FsdA==,i=4096"));
        let fin = || AuthRequest::SaslFinal(Bytes::from_static(b"v=c2ln"));
        for (before, req) in [
            (None, cont()),
            (None, fin()),
            (Some(AuthRequest::Md5 { salt: [0; 4] }), cont()),
            (Some(AuthRequest::Cleartext), fin()),
        ] {
            let mut a = auth("u", Some(b"pw"));
            if let Some(b) = before.clone() {
                a.step(b, &mut BytesMut::new()).unwrap();
            }
            let mut out = BytesMut::new();
            let e = a.step(req.clone(), &mut out).unwrap_err();
            assert!(out.is_empty());
            let msg = e.to_string();
            let name = match req {
                AuthRequest::SaslContinue(_) => "SASLContinue",
                _ => "SASLFinal",
            };
            assert!(msg.contains(name), "{before:?} {name}: {msg}");
        }
        // After the exchange completed, a further SASLFinal is out of place too.
        let mut a = auth("u", Some(b"pw"));
        let last = scram_server(&mut a, sasl());
        a.step(AuthRequest::SaslFinal(last.clone()), &mut BytesMut::new())
            .unwrap();
        assert!(
            a.step(AuthRequest::SaslFinal(last), &mut BytesMut::new())
                .is_err()
        );
    }

    #[test]
    fn a_second_sasl_request_mid_exchange_is_refused() {
        let mut a = auth("u", Some(b"pw"));
        let mut out = BytesMut::new();
        a.step(sasl(), &mut out).unwrap();
        out.clear();
        let e = a.step(sasl(), &mut out).unwrap_err();
        assert!(out.is_empty(), "a second client-first message: {out:?}");
        assert!(e.to_string().contains("AuthenticationSASL"), "{e}");
        // After our proof.
        let mut a = auth("u", Some(b"pw"));
        scram_to_final(&mut a);
        assert!(a.step(sasl(), &mut out).is_err());
        assert!(out.is_empty());
        // After a password method: SASL would start a second exchange.
        let mut a = auth("u", Some(b"pw"));
        a.step(AuthRequest::Md5 { salt: [0; 4] }, &mut out).unwrap();
        out.clear();
        let e = a.step(sasl(), &mut out).unwrap_err();
        assert!(out.is_empty(), "SCRAM after md5: {out:?}");
        assert!(e.to_string().contains("md5"), "{e}");
    }

    /// After a password was sent, the server answers AuthenticationOk or an
    /// error: a second request (md5 then cleartext: the password in clear)
    /// is refused.
    #[test]
    fn a_password_request_is_answered_once() {
        for (first, then) in [
            (AuthRequest::Md5 { salt: [0; 4] }, AuthRequest::Cleartext),
            (AuthRequest::Cleartext, AuthRequest::Cleartext),
            (
                AuthRequest::Md5 { salt: [0; 4] },
                AuthRequest::Md5 { salt: [9; 4] },
            ),
        ] {
            let mut a = auth("u", Some(b"pw"));
            let mut out = BytesMut::new();
            a.step(first.clone(), &mut out).unwrap();
            out.clear();
            let e = a
                .step(then.clone(), &mut out)
                .expect_err(&format!("{first:?} then {then:?}"));
            assert!(out.is_empty(), "{first:?} then {then:?}: sent {out:?}");
            assert!(e.to_string().contains("man in the middle"), "{e}");
        }
    }

    #[test]
    fn nothing_is_answered_after_a_refusal() {
        // A request refused by require_auth does not choose a method, so
        // without the stop a later SASL request would be answered.
        let only_scram = settings("require_auth=scram-sha-256");
        let mut a = Authenticator::new("u", Some(b"pw"), only_scram, None);
        let mut out = BytesMut::new();
        assert!(a.step(AuthRequest::Cleartext, &mut out).is_err());
        let e = a.step(sasl(), &mut out).unwrap_err();
        assert!(out.is_empty(), "{out:?}");
        assert!(
            e.to_string().contains("after authentication was refused"),
            "{e}"
        );
        // Without a password nothing was sent: AuthenticationOk must not log us in.
        let mut a = auth("u", None);
        assert!(a.step(AuthRequest::Md5 { salt: [0; 4] }, &mut out).is_err());
        assert!(a.step(AuthRequest::Ok, &mut out).is_err());
        // A reply that fails half-way leaves nothing behind.
        let mut a = auth("u", Some(b"p\0w"));
        out.extend_from_slice(b"earlier");
        assert!(matches!(
            a.step(AuthRequest::Cleartext, &mut out),
            Err(AuthError::Encode(_))
        ));
        assert_eq!(&out[..], b"earlier");
    }

    #[test]
    fn authentication_ok_before_a_verified_sasl_final_is_refused() {
        // Right after the SASL request.
        let mut a = auth("u", Some(b"pw"));
        let mut out = BytesMut::new();
        a.step(sasl(), &mut out).unwrap();
        assert!(matches!(
            a.step(AuthRequest::Ok, &mut out),
            Err(AuthError::ServerNotVerified)
        ));
        // After our proof, without the server's.
        let mut a = auth("u", Some(b"pw"));
        assert_eq!(scram_to_final(&mut a)[0], b'p');
        let e = a.step(AuthRequest::Ok, &mut BytesMut::new()).unwrap_err();
        assert!(matches!(e, AuthError::ServerNotVerified));
        assert!(e.to_string().contains("man in the middle"), "{e}");
    }

    #[test]
    fn a_forged_server_signature_is_refused() {
        let mut a = auth("u", Some(b"pw"));
        scram_to_final(&mut a);
        let forged = Bytes::from_static(b"v=dGhpcyBpcyBub3QgdGhlIHNpZ25hdHVyZSBvZiB0aGUgc2VydmVy");
        assert!(matches!(
            a.step(AuthRequest::SaslFinal(forged), &mut BytesMut::new()),
            Err(AuthError::Scram(_))
        ));
        // And the exchange cannot be completed afterwards.
        assert!(a.step(AuthRequest::Ok, &mut BytesMut::new()).is_err());
        let mut a = auth("u", Some(b"pw"));
        scram_to_final(&mut a);
        let error = Bytes::from_static(b"e=invalid-proof");
        assert!(
            a.step(AuthRequest::SaslFinal(error), &mut BytesMut::new())
                .is_err()
        );
    }

    #[test]
    fn require_auth_refuses_before_sending_a_password() {
        let scram_only = settings("require_auth=scram-sha-256");
        for req in [
            AuthRequest::Cleartext,
            AuthRequest::Md5 { salt: [1, 2, 3, 4] },
            AuthRequest::Ok,
        ] {
            let mut a = Authenticator::new("u", Some(b"pw"), scram_only, None);
            let mut out = BytesMut::new();
            let e = a.step(req.clone(), &mut out).unwrap_err();
            assert!(
                matches!(e, AuthError::MethodRefused { .. }),
                "{req:?}: {e:?}"
            );
            assert!(out.is_empty(), "{req:?}: nothing sent");
            assert!(e.to_string().contains("require_auth=scram-sha-256"), "{e}");
        }
        let mut a = Authenticator::new("u", Some(b"pw"), scram_only, None);
        assert!(a.step(sasl(), &mut BytesMut::new()).is_ok());
        // Negation: everything but cleartext.
        let no_clear = settings("require_auth=!password");
        let mut a = Authenticator::new("u", Some(b"pw"), no_clear, None);
        assert!(matches!(
            a.step(AuthRequest::Cleartext, &mut BytesMut::new()),
            Err(AuthError::MethodRefused {
                method: "password",
                ..
            })
        ));
        let mut a = Authenticator::new("u", Some(b"pw"), no_clear, None);
        assert!(
            a.step(AuthRequest::Md5 { salt: [0; 4] }, &mut BytesMut::new())
                .is_ok()
        );
    }

    #[test]
    fn channel_binding_chooses_the_mechanism() {
        let first = |params: &str, end_point: Option<Vec<u8>>, mechanisms: &[&str]| {
            let mut a = Authenticator::new("u", Some(b"pw"), settings(params), end_point);
            let mut out = BytesMut::new();
            a.step(
                AuthRequest::Sasl {
                    mechanisms: mechanisms.iter().map(|m| (*m).to_owned()).collect(),
                },
                &mut out,
            )
            .map(|_| String::from_utf8_lossy(&out[5..]).into_owned())
        };
        let both = ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"];
        let hash = Some(vec![7u8; 32]);
        let plus = first("", hash.clone(), &both).unwrap();
        assert!(plus.starts_with("SCRAM-SHA-256-PLUS\0"), "{plus:?}");
        assert!(plus.contains("p=tls-server-end-point,,n=,r="), "{plus:?}");
        let y = first("", hash.clone(), &["SCRAM-SHA-256"]).unwrap();
        assert!(y.contains("y,,n=,r="), "{y:?}");
        let n = first("", None, &both).unwrap();
        assert!(
            n.starts_with("SCRAM-SHA-256\0") && n.contains("n,,n=,r="),
            "{n:?}"
        );
        let off = first("channel_binding=disable", hash.clone(), &both).unwrap();
        assert!(off.contains("n,,n=,r="), "{off:?}");
        let req = "sslmode=require channel_binding=require";
        assert!(
            first(req, hash.clone(), &both)
                .unwrap()
                .starts_with("SCRAM-SHA-256-PLUS\0")
        );
        for (end_point, offered) in [(None, &both[..]), (hash, &["SCRAM-SHA-256"][..])] {
            let e = first(req, end_point, offered).unwrap_err();
            assert!(matches!(e, AuthError::BindingRequired { .. }), "{e:?}");
            assert!(e.to_string().contains("channel_binding=require"), "{e}");
        }
        // Methods that cannot bind are refused before a password is sent.
        let mut a = Authenticator::new("u", Some(b"pw"), settings(req), Some(vec![1; 32]));
        let mut out = BytesMut::new();
        assert!(matches!(
            a.step(AuthRequest::Md5 { salt: [0; 4] }, &mut out),
            Err(AuthError::BindingRequired { .. })
        ));
        assert!(out.is_empty());
    }

    fn req(code: i32, rest: &[u8]) -> AuthRequest {
        let mut body = code.to_be_bytes().to_vec();
        body.extend_from_slice(rest);
        AuthRequest::parse(&Bytes::from(body)).unwrap()
    }

    #[test]
    fn parses_requests() {
        assert_eq!(req(0, b""), AuthRequest::Ok);
        assert_eq!(req(3, b""), AuthRequest::Cleartext);
        assert_eq!(
            req(5, b"\x01\x02\x03\x04"),
            AuthRequest::Md5 { salt: [1, 2, 3, 4] }
        );
        assert_eq!(
            req(10, b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"),
            AuthRequest::Sasl {
                mechanisms: vec!["SCRAM-SHA-256-PLUS".into(), "SCRAM-SHA-256".into()]
            }
        );
        assert_eq!(req(7, b""), AuthRequest::Other(7));
        assert!(AuthRequest::parse(&Bytes::from_static(b"\0\0\0\x05\x01")).is_err());
        assert!(AuthRequest::parse(&Bytes::from_static(b"\0\0\0\0x")).is_err());
        assert!(AuthRequest::parse(&Bytes::from_static(b"\0\0")).is_err());
    }

    /// The md5 exchange as PostgreSQL expects it; the expected hash was
    /// computed independently: md5(md5("outbox_md5" + "outbox_md5").hex + salt).
    #[test]
    fn md5_reply_matches_recorded_exchange() {
        let mut a = auth("outbox_md5", Some(b"outbox_md5"));
        let mut out = BytesMut::new();
        let done = a
            .step(
                AuthRequest::Md5 {
                    salt: [0x9a, 0x1b, 0x2c, 0x3d],
                },
                &mut out,
            )
            .unwrap();
        assert!(!done);
        let mut expected = vec![b'p', 0, 0, 0, 40];
        expected.extend_from_slice(MD5_EXPECTED.as_bytes());
        expected.push(0);
        assert_eq!(&out[..], &expected[..]);
        assert!(a.step(AuthRequest::Ok, &mut out).unwrap());
    }

    const MD5_EXPECTED: &str = "md59c1fdc0175a8ece8d185396ee5a2bf3b";

    #[test]
    fn cleartext_sends_the_password() {
        let mut a = auth("u", Some(b"pw"));
        let mut out = BytesMut::new();
        a.step(AuthRequest::Cleartext, &mut out).unwrap();
        assert_eq!(&out[..], b"p\0\0\0\x07pw\0");
    }

    #[test]
    fn missing_password_and_unsupported_methods_are_errors() {
        let mut a = auth("u", None);
        let mut out = BytesMut::new();
        assert!(matches!(
            a.step(AuthRequest::Md5 { salt: [0; 4] }, &mut out),
            Err(AuthError::NoPassword { method: "md5" })
        ));
        let mut a = auth("u", None);
        assert!(matches!(
            a.step(AuthRequest::Other(7), &mut out),
            Err(AuthError::Unsupported { .. })
        ));
        let mut a = auth("u", Some(b"pw"));
        assert!(matches!(
            a.step(
                AuthRequest::Sasl {
                    mechanisms: vec!["OAUTHBEARER".into()]
                },
                &mut out
            ),
            Err(AuthError::NoScram { .. })
        ));
        assert!(matches!(
            a.step(AuthRequest::SaslContinue(Bytes::new()), &mut out),
            Err(AuthError::OutOfOrder { .. })
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn scram_first_message_uses_no_channel_binding() {
        let mut a = auth("u", Some(b"pw"));
        let mut out = BytesMut::new();
        a.step(
            AuthRequest::Sasl {
                mechanisms: vec!["SCRAM-SHA-256-PLUS".into(), "SCRAM-SHA-256".into()],
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out[0], b'p');
        let body = &out[5..];
        assert!(body.starts_with(b"SCRAM-SHA-256\0"));
        let first = &body[b"SCRAM-SHA-256\0".len() + 4..];
        assert!(
            first.starts_with(b"n,,n=,r="),
            "{:?}",
            String::from_utf8_lossy(first)
        );
        // A server-first message that does not extend our nonce is refused.
        assert!(matches!(
            a.step(
                AuthRequest::SaslContinue(Bytes::from_static(b"r=other,s=c2FsdA==,i=4096")),
                &mut out
            ),
            Err(AuthError::Scram(_))
        ));
    }
}
