//! The client side of PostgreSQL authentication as a pure state machine:
//! one AuthenticationRequest body in, the reply (if any) appended to a buffer.
//!
//! Methods: trust (AuthenticationOk at once), cleartext password (code 3),
//! md5 (code 5: `"md5" + md5(md5(password + user) + salt)` in hex), and
//! SCRAM-SHA-256 (codes 10/11/12). Channel binding is not used: the client
//! sends the gs2 header `n,,`, which PostgreSQL accepts with or without TLS.

use bytes::{Bytes, BytesMut};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};

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
    #[error("unexpected {message} during authentication")]
    OutOfOrder { message: &'static str },
    #[error(transparent)]
    Encode(PgError),
}

/// Progress of one authentication exchange.
pub(crate) struct Authenticator {
    user: String,
    password: Option<Vec<u8>>,
    scram: Option<ScramSha256>,
}

impl Authenticator {
    pub fn new(user: &str, password: Option<&[u8]>) -> Authenticator {
        Authenticator {
            user: user.to_owned(),
            password: password.map(<[u8]>::to_vec),
            scram: None,
        }
    }

    fn password(&self, method: &'static str) -> Result<&[u8], AuthError> {
        self.password
            .as_deref()
            .ok_or(AuthError::NoPassword { method })
    }

    /// Handles one request; appends any reply to `out`. Returns `true` once
    /// the server has accepted us (AuthenticationOk).
    pub fn step(&mut self, req: AuthRequest, out: &mut BytesMut) -> Result<bool, AuthError> {
        match req {
            AuthRequest::Ok => return Ok(true),
            AuthRequest::Cleartext => {
                let pw = self.password("cleartext password")?.to_vec();
                encode::password(&pw, out).map_err(AuthError::Encode)?;
            }
            AuthRequest::Md5 { salt } => {
                let hash = md5_hash(self.user.as_bytes(), self.password("md5")?, salt);
                encode::password(hash.as_bytes(), out).map_err(AuthError::Encode)?;
            }
            AuthRequest::Sasl { mechanisms } => {
                if !mechanisms.iter().any(|m| m == SCRAM_SHA_256) {
                    return Err(AuthError::NoScram {
                        offered: mechanisms,
                    });
                }
                let scram = ScramSha256::new(
                    self.password("SCRAM-SHA-256")?,
                    ChannelBinding::unsupported(),
                );
                encode::sasl_initial(SCRAM_SHA_256, scram.message(), out)
                    .map_err(AuthError::Encode)?;
                self.scram = Some(scram);
            }
            AuthRequest::SaslContinue(data) => {
                let scram = self.scram.as_mut().ok_or(AuthError::OutOfOrder {
                    message: "SASLContinue",
                })?;
                scram.update(&data).map_err(AuthError::Scram)?;
                encode::sasl_response(scram.message(), out).map_err(AuthError::Encode)?;
            }
            AuthRequest::SaslFinal(data) => {
                let scram = self.scram.as_mut().ok_or(AuthError::OutOfOrder {
                    message: "SASLFinal",
                })?;
                // Verifies the server signature: a server that does not know
                // the password cannot complete the exchange.
                scram.finish(&data).map_err(AuthError::Scram)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut a = Authenticator::new("outbox_md5", Some(b"outbox_md5"));
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
        let mut a = Authenticator::new("u", Some(b"pw"));
        let mut out = BytesMut::new();
        a.step(AuthRequest::Cleartext, &mut out).unwrap();
        assert_eq!(&out[..], b"p\0\0\0\x07pw\0");
    }

    #[test]
    fn missing_password_and_unsupported_methods_are_errors() {
        let mut a = Authenticator::new("u", None);
        let mut out = BytesMut::new();
        assert!(matches!(
            a.step(AuthRequest::Md5 { salt: [0; 4] }, &mut out),
            Err(AuthError::NoPassword { method: "md5" })
        ));
        assert!(matches!(
            a.step(AuthRequest::Other(7), &mut out),
            Err(AuthError::Unsupported { .. })
        ));
        let mut a = Authenticator::new("u", Some(b"pw"));
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
        let mut a = Authenticator::new("u", Some(b"pw"));
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
