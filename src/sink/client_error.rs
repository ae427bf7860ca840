//! The client error that explains a failed metadata request.
//!
//! A metadata request that fails only says "timed out" or "transport
//! failure"; the reason (a refused password, an untrusted certificate) came
//! earlier through the client's error callback. Both clients that make such
//! requests (the `check` probe and the topic admin client) keep it here.

use std::sync::{Mutex, PoisonError};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::error::security_code;

/// The last error a client reported, where a security refusal outlives the
/// disconnects it causes.
#[derive(Default)]
pub(super) struct LastClientError(Mutex<Option<(Option<RDKafkaErrorCode>, String)>>);

impl LastClientError {
    /// Called from the client's error callback.
    pub(super) fn record(&self, error: &KafkaError, reason: &str) {
        let code = refusal_by_alert(error.rdkafka_error_code(), reason);
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // The broker closes the connection after refusing authentication or
        // the TLS handshake: the refusal, not the closed connection, is the
        // cause to report.
        let keeps_refusal = matches!(&*last, Some((Some(c), _)) if security_code(*c));
        if keeps_refusal && !code.is_some_and(security_code) {
            return;
        }
        *last = Some((code, reason.to_owned()));
    }

    /// Whether a security refusal (credentials, certificates) was recorded.
    pub(super) fn holds_refusal(&self) -> bool {
        matches!(
            &*self.0.lock().unwrap_or_else(PoisonError::into_inner),
            Some((Some(c), _)) if security_code(*c)
        )
    }

    /// The code and text that explain `failed` (a metadata request's error),
    /// consuming what was recorded.
    pub(super) fn explain(&self, failed: &KafkaError) -> (Option<RDKafkaErrorCode>, String) {
        let last = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        match last {
            // A timeout says less than the error that caused it.
            Some((Some(code), reason)) => (Some(code), reason),
            Some((None, reason)) => (failed.rdkafka_error_code(), reason),
            None => (failed.rdkafka_error_code(), String::new()),
        }
    }
}

/// A broker that refuses the client's certificate (expired, unknown CA)
/// ends the handshake with a TLS alert, which librdkafka reports as a
/// transport failure with the alert in its text: the one case where the
/// class has to be read from the text, since no code says it.
fn refusal_by_alert(code: Option<RDKafkaErrorCode>, reason: &str) -> Option<RDKafkaErrorCode> {
    match code {
        Some(RDKafkaErrorCode::BrokerTransportFailure) if reason.contains("SSL alert number") => {
            Some(RDKafkaErrorCode::SSL)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::MetadataFetch(code)
    }

    /// What the client's error callback was given, in order.
    fn recorded(errors: &[(RDKafkaErrorCode, &str)]) -> LastClientError {
        let last = LastClientError::default();
        for (code, reason) in errors {
            last.record(&err(*code), reason);
        }
        last
    }

    #[test]
    fn a_refusal_outlives_the_disconnect_it_causes() {
        let last = recorded(&[
            (RDKafkaErrorCode::Authentication, "invalid credentials"),
            (RDKafkaErrorCode::BrokerTransportFailure, "disconnected"),
        ]);
        let (code, reason) = last.explain(&err(RDKafkaErrorCode::OperationTimedOut));
        assert_eq!(code, Some(RDKafkaErrorCode::Authentication));
        assert_eq!(reason, "invalid credentials");
    }

    #[test]
    fn a_tls_alert_from_the_broker_is_a_refusal() {
        let last = LastClientError::default();
        last.record(
            &err(RDKafkaErrorCode::BrokerTransportFailure),
            "ssl://127.0.0.1:19096/bootstrap: Receive failed: error:0A000416:SSL routines::\
             sslv3 alert certificate unknown: SSL alert number 46",
        );
        assert!(last.holds_refusal());
        last.record(
            &err(RDKafkaErrorCode::BrokerTransportFailure),
            "Connection refused",
        );
        assert_eq!(
            last.explain(&err(RDKafkaErrorCode::OperationTimedOut)).0,
            Some(RDKafkaErrorCode::SSL)
        );
    }

    #[test]
    fn a_later_error_replaces_an_earlier_transient_one() {
        let last = recorded(&[
            (
                RDKafkaErrorCode::BrokerTransportFailure,
                "connection refused",
            ),
            (RDKafkaErrorCode::SSL, "certificate verify failed"),
        ]);
        assert_eq!(
            last.explain(&err(RDKafkaErrorCode::OperationTimedOut)).0,
            Some(RDKafkaErrorCode::SSL)
        );
        // Consumed: the next failure is explained by its own errors.
        assert_eq!(
            last.explain(&err(RDKafkaErrorCode::OperationTimedOut)),
            (Some(RDKafkaErrorCode::OperationTimedOut), String::new())
        );
    }
}
