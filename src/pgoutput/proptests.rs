//! Property tests: no input makes the decoder panic, errors point inside the
//! input, and every message survives encode → decode.

use bytes::Bytes;
use proptest::prelude::*;

use super::encode::encoded;
use super::*;
use crate::pg::{Lsn, PgTimestamp};

/// Every first byte the decoder gives a meaning to, valid in v1 or not.
const TAGS: &[u8] = b"BCORYIUDTMSEcAbPKrp";

fn name() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,12}"
}

fn value_bytes() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn column_value() -> impl Strategy<Value = ColumnValue> {
    prop_oneof![
        Just(ColumnValue::Null),
        Just(ColumnValue::UnchangedToast),
        value_bytes().prop_map(ColumnValue::Text),
        value_bytes().prop_map(ColumnValue::Binary),
    ]
}

fn tuple() -> impl Strategy<Value = TupleData> {
    prop::collection::vec(column_value(), 0..6).prop_map(|columns| TupleData { columns })
}

fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple().prop_map(OldTuple::Key),
        tuple().prop_map(OldTuple::Full)
    ]
}

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn::new)
}

fn time() -> impl Strategy<Value = PgTimestamp> {
    any::<i64>().prop_map(PgTimestamp)
}

fn relation_column() -> impl Strategy<Value = RelationColumn> {
    (any::<u8>(), name(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| RelationColumn {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    )
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (lsn(), time(), any::<u32>()).prop_map(|(final_lsn, commit_time, xid)| {
            Message::Begin(Begin {
                final_lsn,
                commit_time,
                xid,
            })
        }),
        (any::<u8>(), lsn(), lsn(), time()).prop_map(
            |(flags, commit_lsn, end_lsn, commit_time)| Message::Commit(Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_time,
            })
        ),
        (lsn(), name()).prop_map(|(commit_lsn, name)| Message::Origin(Origin { commit_lsn, name })),
        (
            any::<u32>(),
            name(),
            name(),
            any::<u8>(),
            prop::collection::vec(relation_column(), 0..5)
        )
            .prop_map(|(oid, namespace, name, replica_identity, columns)| {
                Message::Relation(Relation {
                    oid,
                    namespace,
                    name,
                    replica_identity,
                    columns,
                })
            }),
        (any::<u32>(), name(), name()).prop_map(|(oid, namespace, name)| {
            Message::Type(TypeInfo {
                oid,
                namespace,
                name,
            })
        }),
        (any::<u32>(), tuple())
            .prop_map(|(relation_oid, new)| { Message::Insert(Insert { relation_oid, new }) }),
        (any::<u32>(), prop::option::of(old_tuple()), tuple()).prop_map(
            |(relation_oid, old, new)| Message::Update(Update {
                relation_oid,
                old,
                new,
            })
        ),
        (any::<u32>(), old_tuple())
            .prop_map(|(relation_oid, old)| { Message::Delete(Delete { relation_oid, old }) }),
        (any::<u8>(), prop::collection::vec(any::<u32>(), 0..6)).prop_map(
            |(options, relation_oids)| Message::Truncate(Truncate {
                options,
                relation_oids,
            })
        ),
        (any::<bool>(), lsn(), name(), value_bytes()).prop_map(
            |(transactional, lsn, prefix, content)| Message::Message(LogicalMessage {
                transactional,
                lsn,
                prefix,
                content,
            })
        ),
    ]
}

/// What decoding returns for `msg`: "" namespaces come back as `pg_catalog`.
fn normalized(mut msg: Message) -> Message {
    let ns = match &mut msg {
        Message::Relation(r) => Some(&mut r.namespace),
        Message::Type(t) => Some(&mut t.namespace),
        _ => None,
    };
    if let Some(ns) = ns.filter(|ns| ns.is_empty()) {
        *ns = "pg_catalog".to_owned();
    }
    msg
}

/// Errors name the input's first byte and an offset inside the input.
fn check_error_points_inside(input: &Bytes, e: &DecodeError) -> Result<(), TestCaseError> {
    prop_assert_eq!(e.tag(), input.first().copied());
    prop_assert!(
        e.offset() <= input.len(),
        "offset {} beyond input of {} bytes: {}",
        e.offset(),
        input.len(),
        e
    );
    if let DecodeErrorKind::Truncated { needed, available } = e.kind() {
        prop_assert!(needed > available);
        prop_assert_eq!(e.offset() + available, input.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..200)) {
        let input = Bytes::from(data);
        if let Err(e) = decode(&input) {
            check_error_points_inside(&input, &e)?;
        }
    }

    #[test]
    fn known_tag_with_random_tail_never_panics(
        tag in prop::sample::select(TAGS),
        tail in prop::collection::vec(any::<u8>(), 0..120),
    ) {
        let mut data = vec![tag];
        data.extend(tail);
        let input = Bytes::from(data);
        match decode(&input) {
            Ok(m) => prop_assert_eq!(m.tag(), tag),
            Err(e) => check_error_points_inside(&input, &e)?,
        }
    }

    #[test]
    fn corrupting_one_byte_of_a_valid_message_never_panics(
        msg in message(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut data = encoded(&msg).to_vec();
        let i = at.index(data.len());
        data[i] = byte;
        let input = Bytes::from(data);
        if let Err(e) = decode(&input) {
            check_error_points_inside(&input, &e)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn every_message_round_trips(msg in message()) {
        let decoded = decode(&encoded(&msg));
        prop_assert_eq!(decoded, Ok(normalized(msg)));
    }

    #[test]
    fn every_strict_prefix_fails_and_extra_bytes_are_rejected(
        msg in message(),
        cut in any::<prop::sample::Index>(),
        extra in prop::collection::vec(any::<u8>(), 1..4),
    ) {
        let full = encoded(&msg);
        let prefix = full.slice(..cut.index(full.len()));
        let e = decode(&prefix).expect_err("a strict prefix is never a whole message");
        prop_assert!(
            matches!(
                e.kind(),
                DecodeErrorKind::Truncated { .. } | DecodeErrorKind::BadString(BadString::NoNul)
            ),
            "{}",
            e
        );
        check_error_points_inside(&prefix, &e)?;

        let mut longer = full.to_vec();
        longer.extend_from_slice(&extra);
        let e = decode(&Bytes::from(longer)).expect_err("trailing bytes");
        prop_assert_eq!(e.kind(), &DecodeErrorKind::TrailingBytes { count: extra.len() });
        prop_assert_eq!(e.offset(), full.len());
    }
}
