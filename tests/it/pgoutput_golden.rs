//! Golden tests: pgoutput bytes captured from a real PostgreSQL by
//! scripts/capture-pgoutput-fixtures.sh, decoded and checked value by value.
//!
//! One set per major: tests/fixtures/pgoutput/ (15) and
//! tests/fixtures/pgoutput-<major>/ (14, 16, 17, 18); every test runs on every
//! set. The message formats are the same in all of them; what differs is
//! cluster-dependent (below) and, before 15, the empty transactions pgoutput
//! sends for transactions that changed no published table (here the capture's
//! flushing writes and the DDL): [`fixtures`] leaves those out, and
//! [`the_stream_has_exactly_the_expected_messages_in_order`] checks they are
//! empty. 13 has no set: its pgoutput has no logical decoding messages, which
//! the workload needs (tests/it/pgoutput_live.rs decodes 13's stream live).
//!
//! Values that depend on the capturing cluster (OIDs of the tables and the enum
//! type, LSNs, xids, timestamps) are checked for consistency with each other
//! and with the MANIFEST; everything the workload determines is checked exactly.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use outbox_cdc::pg::Lsn;
use outbox_cdc::pgoutput::{
    ColumnValue, Commit, Message, OldTuple, Relation, RelationCache, RelationColumn, TupleData,
    decode,
};

/// Built-in type OIDs (pg_type.dat).
const INT4: u32 = 23;
const INT8: u32 = 20;
const TEXT: u32 = 25;
const VARCHAR: u32 = 1043;
const NUMERIC: u32 = 1700;
/// `VARHDRSZ + 40` for varchar(40); `((12 << 16) | 2) + VARHDRSZ` for numeric(12,2).
const VARCHAR_40_TYPMOD: i32 = 44;
const NUMERIC_12_2_TYPMOD: i32 = ((12 << 16) | 2) + 4;

const SCHEMA: &str = "pgoutput_fixture";

struct Fixture {
    file: String,
    step: String,
    lsn: Lsn,
    xid: u32,
    message: Message,
}

std::thread_local! {
    /// The set the running check reads (see [`each_major`]).
    static SET: std::cell::RefCell<PathBuf> = const { std::cell::RefCell::new(PathBuf::new()) };
}

fn fixture_dir() -> PathBuf {
    SET.with(|s| s.borrow().clone())
}

/// Every captured set: tests/fixtures/pgoutput and tests/fixtures/pgoutput-<major>.
fn fixture_sets() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut sets: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("pgoutput"))
                // pgoutput-stream-<major>: tests/it/pgoutput_stream_golden.rs
                .is_some_and(|n| {
                    n.is_empty()
                        || n.strip_prefix('-')
                            .is_some_and(|m| m.parse::<u32>().is_ok())
                })
        })
        .collect();
    sets.sort();
    assert!(sets.len() >= 5, "fixture sets missing: {sets:?}");
    sets
}

/// Runs `check` on every captured set, naming the set when it fails.
fn each_major(check: fn()) {
    for set in fixture_sets() {
        SET.with(|s| *s.borrow_mut() = set.clone());
        if let Err(panic) = std::panic::catch_unwind(check) {
            eprintln!("failed on the fixture set {}", set.display());
            std::panic::resume_unwind(panic);
        }
    }
}

/// `server_version_num` from the set's MANIFEST.
fn server_version() -> u32 {
    let dir = fixture_dir();
    let manifest = std::fs::read_to_string(dir.join("MANIFEST"))
        .unwrap_or_else(|e| panic!("cannot read {}/MANIFEST: {e}", dir.display()));
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("# server_version_num "))
        .and_then(|rest| rest.split(';').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}/MANIFEST names no server_version_num", dir.display()))
}

/// Every fixture in stream order, decoded, without the empty transactions
/// (a Begin directly followed by its Commit) that servers before 15 send.
fn fixtures() -> Vec<Fixture> {
    let mut out: Vec<Fixture> = Vec::new();
    for f in all_fixtures() {
        if matches!(f.message, Message::Commit(_))
            && matches!(out.last().map(|l| &l.message), Some(Message::Begin(_)))
        {
            assert!(
                server_version() < 150000,
                "{}: an empty transaction",
                f.file
            );
            out.pop();
            continue;
        }
        out.push(f);
    }
    out
}

/// Every fixture in stream order, decoded, as captured.
fn all_fixtures() -> Vec<Fixture> {
    let dir = fixture_dir();
    let manifest = std::fs::read_to_string(dir.join("MANIFEST"))
        .unwrap_or_else(|e| panic!("cannot read {}/MANIFEST: {e}", dir.display()));
    manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [file, step, lsn, xid] = fields[..] else {
                panic!("bad MANIFEST line {line:?}")
            };
            let data = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            let message = decode(&Bytes::from(data)).unwrap_or_else(|e| panic!("{file}: {e}"));
            Fixture {
                file: file.to_owned(),
                step: step.to_owned(),
                lsn: lsn.parse().unwrap_or_else(|e| panic!("{file}: {e}")),
                xid: xid.parse().unwrap_or_else(|e| panic!("{file}: {e}")),
                message,
            }
        })
        .collect()
}

fn step(name: &str) -> Vec<Fixture> {
    fixtures().into_iter().filter(|f| f.step == name).collect()
}

fn tags(fixtures: &[Fixture]) -> String {
    fixtures
        .iter()
        .map(|f| char::from(f.message.tag()))
        .collect()
}

/// A column value as text: `NULL`, `<unchanged toast>`, the text, or hex.
fn show(value: &ColumnValue) -> String {
    match value {
        ColumnValue::Null => "NULL".to_owned(),
        ColumnValue::UnchangedToast => "<unchanged toast>".to_owned(),
        ColumnValue::Text(b) => String::from_utf8(b.to_vec()).expect("fixture text is UTF-8"),
        ColumnValue::Binary(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

fn row(tuple: &TupleData) -> Vec<String> {
    tuple.columns.iter().map(show).collect()
}

fn relation(f: &Fixture) -> &Relation {
    match &f.message {
        Message::Relation(r) => r,
        other => panic!("{}: expected a Relation, got {other:?}", f.file),
    }
}

fn column(name: &str, key: bool, type_oid: u32, type_modifier: i32) -> RelationColumn {
    RelationColumn {
        flags: u8::from(key),
        name: name.to_owned(),
        type_oid,
        type_modifier,
    }
}

fn accounts_columns(mood_oid: u32) -> Vec<RelationColumn> {
    vec![
        column("id", true, INT4, -1),
        column("name", false, VARCHAR, VARCHAR_40_TYPMOD),
        column("balance", false, NUMERIC, NUMERIC_12_2_TYPMOD),
        column("mood", false, mood_oid, -1),
        column("note", false, TEXT, -1),
    ]
}

/// The enum type's OID from the step's Type message, after checking its names.
fn mood_type(f: &Fixture) -> u32 {
    let Message::Type(t) = &f.message else {
        panic!("{}: expected a Type, got {:?}", f.file, f.message)
    };
    assert_eq!((t.namespace.as_str(), t.name.as_str()), (SCHEMA, "mood"));
    t.oid
}

fn check_accounts(f: &Fixture, mood_oid: u32) -> u32 {
    let rel = relation(f);
    assert_eq!(rel.qualified_name(), "pgoutput_fixture.accounts");
    assert_eq!(rel.replica_identity, b'd');
    assert_eq!(rel.columns, accounts_columns(mood_oid));
    rel.oid
}

#[test]
fn the_stream_has_exactly_the_expected_messages_in_order() {
    each_major(check_the_stream_has_exactly_the_expected_messages_in_order);
}

fn check_the_stream_has_exactly_the_expected_messages_in_order() {
    let all = fixtures();
    let got: Vec<(String, char)> = all
        .iter()
        .map(|f| (f.step.clone(), char::from(f.message.tag())))
        .collect();
    let captured = all_fixtures();
    if server_version() < 150000 {
        assert!(
            captured.len() > all.len(),
            "no empty transactions before 15"
        );
    } else {
        assert_eq!(captured.len(), all.len());
    }
    // Every file name carries its stream position, tag and step.
    for (i, f) in captured.iter().enumerate() {
        let expected_name = format!(
            "{:02}_{}_{}.bin",
            i + 1,
            char::from(f.message.tag()),
            f.step
        );
        assert_eq!(f.file, expected_name);
    }
    let expected: Vec<(String, char)> = [
        ("insert_accounts", "BYRIIC"),
        ("update_accounts", "BYRUUC"),
        ("full_identity", "BRIUDC"),
        ("delete_account", "BYRDC"),
        ("insert_doc", "BRIC"),
        ("update_doc_title", "BRUC"),
        // add_column: DDL itself is not replicated
        ("insert_after_alter", "BYRIC"),
        ("truncate", "BRRTC"),
        ("tx_messages", "BYRIMMC"),
        ("non_tx_message", "M"),
        // rollback: nothing, ever
        ("after_rollback", "BYRIC"),
        // applied through a replication origin: 'O' right after Begin
        ("origin", "BOYRIC"),
    ]
    .iter()
    .flat_map(|(s, tags)| tags.chars().map(move |t| (s.to_string(), t)))
    .collect();
    assert_eq!(got, expected);

    // No stray files beside the manifest's.
    let listed: BTreeSet<String> = captured.iter().map(|f| f.file.clone()).collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(fixture_dir())
        .expect("fixture dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".bin"))
        .collect();
    assert_eq!(listed, on_disk);
}

#[test]
fn transactions_are_framed_by_matching_begin_and_commit() {
    each_major(check_transactions_are_framed_by_matching_begin_and_commit);
}

fn check_transactions_are_framed_by_matching_begin_and_commit() {
    let all = fixtures();
    let mut open: Option<(&Fixture, outbox_cdc::pgoutput::Begin)> = None;
    let mut last_end = Lsn::ZERO;
    let mut transactions = 0;
    for f in &all {
        match &f.message {
            Message::Begin(b) => {
                assert!(open.is_none(), "{}: Begin inside a transaction", f.file);
                assert_eq!(b.xid, f.xid, "{}: xid", f.file);
                open = Some((f, *b));
            }
            Message::Commit(c) => {
                let (begin_file, b) = open.take().expect("Commit without Begin");
                let Commit {
                    flags,
                    commit_lsn,
                    end_lsn,
                    commit_time,
                } = *c;
                assert_eq!(flags, 0, "{}", f.file);
                assert_eq!(b.final_lsn, commit_lsn, "{} vs {}", begin_file.file, f.file);
                assert_eq!(b.commit_time, commit_time, "{}", f.file);
                assert!(end_lsn > commit_lsn, "{}", f.file);
                // The slot function reports a Commit at the transaction's end LSN.
                assert_eq!(end_lsn, f.lsn, "{}", f.file);
                assert!(end_lsn > last_end, "{}: commits go forward", f.file);
                assert_eq!(f.xid, b.xid, "{}", f.file);
                // Captured after 2020 and not in the future; a transaction
                // applied through a replication origin carries the origin's
                // commit time instead (see the origin test).
                let ms = commit_time.unix_millis();
                if f.step != "origin" {
                    assert!(ms > 1_577_836_800_000, "{}: commit time {ms}", f.file);
                }
                assert!(ms <= outbox_cdc::pg::PgTimestamp::now().unix_millis());
                last_end = end_lsn;
                transactions += 1;
            }
            Message::Message(m) if !m.transactional => {
                assert!(open.is_none(), "{}: non-transactional inside", f.file);
            }
            _ => {
                let (begin_file, b) = open.as_ref().unwrap_or_else(|| {
                    panic!("{}: change outside a transaction", f.file);
                });
                assert_eq!(f.xid, b.xid, "{} in {}", f.file, begin_file.file);
            }
        }
    }
    assert!(open.is_none(), "stream ends inside a transaction");
    assert_eq!(transactions, 11);
}

#[test]
fn inserts_with_enum_type_nulls_and_utf8() {
    each_major(check_inserts_with_enum_type_nulls_and_utf8);
}

fn check_inserts_with_enum_type_nulls_and_utf8() {
    let s = step("insert_accounts");
    assert_eq!(tags(&s), "BYRIIC");
    let mood = mood_type(&s[1]);
    let oid = check_accounts(&s[2], mood);
    let rel = relation(&s[2]);
    let rows: Vec<Vec<String>> = s[3..5]
        .iter()
        .map(|f| match &f.message {
            Message::Insert(i) => {
                assert_eq!(i.relation_oid, oid);
                row(&i.new)
            }
            other => panic!("{}: {other:?}", f.file),
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            vec!["1", "alice", "100.50", "happy", "NULL"],
            vec!["2", "zoë", "0.00", "sad", "has a note"],
        ]
    );
    let Message::Insert(first) = &s[3].message else {
        unreachable!()
    };
    assert_eq!(
        rel.value(&first.new, "note").map(ColumnValue::is_null),
        Some(true)
    );
    assert_eq!(
        rel.value(&first.new, "mood").and_then(ColumnValue::as_str),
        Some("happy")
    );
}

#[test]
fn updates_with_and_without_a_changed_key() {
    each_major(check_updates_with_and_without_a_changed_key);
}

fn check_updates_with_and_without_a_changed_key() {
    let s = step("update_accounts");
    assert_eq!(tags(&s), "BYRUUC");
    let oid = check_accounts(&s[2], mood_type(&s[1]));
    let Message::Update(plain) = &s[3].message else {
        panic!("{:?}", s[3].message)
    };
    assert_eq!(plain.relation_oid, oid);
    assert_eq!(plain.old, None, "key unchanged: no old tuple");
    assert_eq!(row(&plain.new), ["1", "alice", "90.25", "happy", "NULL"]);

    let Message::Update(rekey) = &s[4].message else {
        panic!("{:?}", s[4].message)
    };
    assert_eq!(rekey.relation_oid, oid);
    let Some(OldTuple::Key(old)) = &rekey.old else {
        panic!("key changed: expected an old key, got {:?}", rekey.old)
    };
    // A 'K' tuple has every column; those outside the key are sent as nulls.
    assert_eq!(row(old), ["2", "NULL", "NULL", "NULL", "NULL"]);
    assert_eq!(row(&rekey.new), ["20", "zoë", "0.00", "sad", "has a note"]);
}

#[test]
fn replica_identity_full_sends_whole_old_rows() {
    each_major(check_replica_identity_full_sends_whole_old_rows);
}

fn check_replica_identity_full_sends_whole_old_rows() {
    let s = step("full_identity");
    assert_eq!(tags(&s), "BRIUDC");
    let rel = relation(&s[1]);
    assert_eq!(rel.qualified_name(), "pgoutput_fixture.events");
    assert_eq!(rel.replica_identity, b'f');
    // With REPLICA IDENTITY FULL every column is flagged as part of the key.
    assert_eq!(
        rel.columns,
        vec![
            column("id", true, INT8, -1),
            column("payload", true, TEXT, -1)
        ]
    );
    let Message::Insert(i) = &s[2].message else {
        panic!()
    };
    assert_eq!(
        (i.relation_oid, row(&i.new)),
        (rel.oid, vec!["1".into(), "created".into()])
    );
    let Message::Update(u) = &s[3].message else {
        panic!()
    };
    let Some(OldTuple::Full(old)) = &u.old else {
        panic!("expected an 'O' old row, got {:?}", u.old)
    };
    assert_eq!(row(old), ["1", "created"]);
    assert_eq!(row(&u.new), ["1", "updated"]);
    let Message::Delete(d) = &s[4].message else {
        panic!()
    };
    assert_eq!(d.relation_oid, rel.oid);
    let OldTuple::Full(old) = &d.old else {
        panic!("expected an 'O' old row, got {:?}", d.old)
    };
    assert_eq!(row(old), ["1", "updated"]);
}

#[test]
fn delete_with_default_identity_sends_the_key() {
    each_major(check_delete_with_default_identity_sends_the_key);
}

fn check_delete_with_default_identity_sends_the_key() {
    let s = step("delete_account");
    assert_eq!(tags(&s), "BYRDC");
    let oid = check_accounts(&s[2], mood_type(&s[1]));
    let Message::Delete(d) = &s[3].message else {
        panic!()
    };
    assert_eq!(d.relation_oid, oid);
    let OldTuple::Key(key) = &d.old else {
        panic!("expected 'K', got {:?}", d.old)
    };
    assert_eq!(row(key), ["20", "NULL", "NULL", "NULL", "NULL"]);
}

#[test]
fn unchanged_toast_value_is_marked_not_sent() {
    each_major(check_unchanged_toast_value_is_marked_not_sent);
}

fn check_unchanged_toast_value_is_marked_not_sent() {
    let body = "0123456789abcdef".repeat(256);
    let inserted = step("insert_doc");
    assert_eq!(tags(&inserted), "BRIC");
    let rel = relation(&inserted[1]);
    assert_eq!(rel.qualified_name(), "pgoutput_fixture.docs");
    assert_eq!(
        rel.columns,
        vec![
            column("id", true, INT4, -1),
            column("title", false, TEXT, -1),
            column("body", false, TEXT, -1),
        ]
    );
    let Message::Insert(i) = &inserted[2].message else {
        panic!()
    };
    assert_eq!(row(&i.new), ["1", "v1", body.as_str()]);

    let updated = step("update_doc_title");
    assert_eq!(tags(&updated), "BRUC");
    assert_eq!(relation(&updated[1]), rel);
    let Message::Update(u) = &updated[2].message else {
        panic!()
    };
    assert_eq!(u.relation_oid, rel.oid);
    assert_eq!(u.old, None);
    assert_eq!(row(&u.new), ["1", "v2", "<unchanged toast>"]);
    assert_eq!(
        rel.value(&u.new, "body"),
        Some(&ColumnValue::UnchangedToast)
    );
}

#[test]
fn alter_table_mid_stream_sends_a_new_relation_for_the_same_oid() {
    each_major(check_alter_table_mid_stream_sends_a_new_relation_for_the_same_oid);
}

fn check_alter_table_mid_stream_sends_a_new_relation_for_the_same_oid() {
    let before = step("insert_accounts");
    let mood = mood_type(&before[1]);
    let oid = check_accounts(&before[2], mood);
    assert!(step("add_column").is_empty(), "DDL is not replicated");

    let after = step("insert_after_alter");
    assert_eq!(tags(&after), "BYRIC");
    assert_eq!(mood_type(&after[1]), mood);
    let rel = relation(&after[2]);
    assert_eq!(rel.oid, oid, "same table, same OID");
    let mut columns = accounts_columns(mood);
    columns.push(column("email", false, TEXT, -1));
    assert_eq!(rel.columns, columns);

    let mut cache = RelationCache::new();
    cache.apply(relation(&before[2]).clone());
    let replaced = cache
        .apply(rel.clone())
        .expect("replaces the earlier definition");
    assert_eq!(replaced.columns.len(), 5);
    assert_eq!(cache.len(), 1);
    let current = cache.get(oid).expect("cached");
    let Message::Insert(i) = &after[3].message else {
        panic!()
    };
    assert_eq!(
        row(&i.new),
        ["3", "carol", "7.00", "ok", "NULL", "carol@example.com"]
    );
    assert_eq!(
        current.value(&i.new, "email").and_then(ColumnValue::as_str),
        Some("carol@example.com")
    );
}

#[test]
fn truncate_of_two_tables_with_options() {
    each_major(check_truncate_of_two_tables_with_options);
}

fn check_truncate_of_two_tables_with_options() {
    let s = step("truncate");
    assert_eq!(tags(&s), "BRRTC");
    let events = relation(&s[1]);
    let docs = relation(&s[2]);
    assert_eq!(events.name, "events");
    assert_eq!(docs.name, "docs");
    let Message::Truncate(t) = &s[3].message else {
        panic!()
    };
    assert_eq!(t.relation_oids, vec![events.oid, docs.oid]);
    assert_eq!(t.options, 3);
    assert!(t.cascade());
    assert!(t.restart_identity());
}

#[test]
fn logical_decoding_messages() {
    each_major(check_logical_decoding_messages);
}

fn check_logical_decoding_messages() {
    let s = step("tx_messages");
    assert_eq!(tags(&s), "BYRIMMC");
    let Message::Begin(begin) = &s[0].message else {
        panic!()
    };
    let Message::Insert(i) = &s[3].message else {
        panic!()
    };
    assert_eq!(row(&i.new), ["4", "dave", "NULL", "NULL", "NULL", "NULL"]);
    let messages: Vec<_> = s[4..6]
        .iter()
        .map(|f| match &f.message {
            Message::Message(m) => {
                assert_eq!(m.lsn, f.lsn, "{}", f.file);
                // The end of the message's WAL record: at most the commit record's start.
                assert!(m.lsn <= begin.final_lsn, "{}: before the commit", f.file);
                (m.transactional, m.prefix.as_str(), m.content.to_vec())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        messages,
        vec![
            (true, "fixture", b"hello from a transaction".to_vec()),
            (true, "fixture-bin", vec![0x00, 0xff, 0x01]),
        ]
    );

    let s = step("non_tx_message");
    assert_eq!(tags(&s), "M");
    let Message::Message(m) = &s[0].message else {
        panic!()
    };
    assert!(!m.transactional);
    assert_eq!(m.prefix, "fixture");
    assert_eq!(&m.content[..], b"outside any transaction");
    assert_eq!(m.lsn, s[0].lsn);
    assert_eq!(s[0].xid, 0, "not part of any transaction");
}

#[test]
fn rolled_back_work_never_appears() {
    each_major(check_rolled_back_work_never_appears);
}

fn check_rolled_back_work_never_appears() {
    let all = fixtures();
    assert!(step("rollback").is_empty());
    for f in &all {
        let tuples: Vec<&TupleData> = match &f.message {
            Message::Insert(i) => vec![&i.new],
            Message::Update(u) => u.old.iter().map(OldTuple::tuple).chain([&u.new]).collect(),
            Message::Delete(d) => vec![d.old.tuple()],
            Message::Message(m) => {
                assert_ne!(&m.content[..], b"never sent", "{}", f.file);
                vec![]
            }
            _ => vec![],
        };
        for t in tuples {
            let values = row(t);
            assert!(
                !values.iter().any(|v| v == "99" || v == "never"),
                "{}",
                f.file
            );
        }
    }
    // The stream goes on after the rollback.
    let after = step("after_rollback");
    assert_eq!(tags(&after), "BYRIC");
    let Message::Insert(i) = &after[3].message else {
        panic!()
    };
    assert_eq!(row(&i.new), ["5", "erin", "NULL", "NULL", "NULL", "NULL"]);
}

#[test]
fn every_change_resolves_through_the_relation_cache() {
    each_major(check_every_change_resolves_through_the_relation_cache);
}

fn check_every_change_resolves_through_the_relation_cache() {
    let mut cache = RelationCache::new();
    let mut changes = 0;
    for f in fixtures() {
        let (oid, tuple) = match &f.message {
            Message::Relation(r) => {
                cache.apply(r.clone());
                continue;
            }
            Message::Insert(i) => (i.relation_oid, &i.new),
            Message::Update(u) => (u.relation_oid, &u.new),
            Message::Delete(d) => (d.relation_oid, d.old.tuple()),
            _ => continue,
        };
        let rel = cache
            .get(oid)
            .unwrap_or_else(|| panic!("{}: relation {oid} not sent before its change", f.file));
        assert_eq!(tuple.len(), rel.columns.len(), "{}", f.file);
        assert!(rel.value(tuple, "id").is_some(), "{}", f.file);
        changes += 1;
    }
    assert_eq!(changes, 14);
    assert_eq!(cache.len(), 3);
}

/// A transaction applied through a replication origin (what a subscription's
/// apply worker writes): 'O' follows Begin with the origin's name and the
/// commit LSN the capture script gave it. The bytes are also read by hand
/// here, not through the project's decoder or encoder, so a misreading that
/// the property test's encode/decode round trip would cancel out shows.
#[test]
fn origin_follows_begin_with_its_name_and_commit_lsn() {
    each_major(check_origin_follows_begin_with_its_name_and_commit_lsn);
}

fn check_origin_follows_begin_with_its_name_and_commit_lsn() {
    const ORIGIN_NAME: &str = "pgoutput_fixture_origin";
    const ORIGIN_LSN: u64 = 0x1_2345_6789; // '1/23456789' in the capture script
    let s = step("origin");
    assert_eq!(tags(&s), "BOYRIC");
    let Message::Begin(begin) = &s[0].message else {
        panic!("{:?}", s[0].message)
    };
    let Message::Origin(origin) = &s[1].message else {
        panic!("{}: expected an Origin, got {:?}", s[1].file, s[1].message)
    };
    assert_eq!(origin.name, ORIGIN_NAME);
    assert_eq!(origin.commit_lsn, Lsn::new(ORIGIN_LSN));
    assert_eq!(origin.commit_lsn.to_string(), "1/23456789");
    assert_eq!(s[1].xid, begin.xid, "the Origin belongs to the transaction");

    // Protocol: Byte1('O'), Int64 commit LSN on the origin, String name.
    let raw = std::fs::read(fixture_dir().join(&s[1].file)).expect("origin fixture");
    let mut expected = vec![b'O'];
    expected.extend_from_slice(&ORIGIN_LSN.to_be_bytes());
    expected.extend_from_slice(ORIGIN_NAME.as_bytes());
    expected.push(0);
    assert_eq!(raw, expected, "{}: raw bytes", s[1].file);

    // Begin and Commit carry the origin's commit time given to
    // pg_replication_origin_xact_setup (2001-02-03 04:05:06 UTC), not the
    // local one: logical decoding replaces it (decode.c, DecodeCommit), so it
    // is also what such an event's Kafka timestamp would be.
    let Message::Commit(commit) = &s[5].message else {
        panic!("{:?}", s[5].message)
    };
    assert_eq!(begin.commit_time.unix_millis(), 981_173_106_000);
    assert_eq!(commit.commit_time, begin.commit_time);
    assert_eq!(begin.final_lsn, commit.commit_lsn);
    assert_ne!(commit.commit_lsn, origin.commit_lsn, "the local commit LSN");

    let rel = relation(&s[3]);
    assert_eq!(rel.qualified_name(), "pgoutput_fixture.accounts");
    let mut columns = accounts_columns(mood_type(&s[2]));
    columns.push(column("email", false, TEXT, -1));
    assert_eq!(rel.columns, columns);
    let Message::Insert(i) = &s[4].message else {
        panic!("{:?}", s[4].message)
    };
    assert_eq!(i.relation_oid, rel.oid);
    assert_eq!(row(&i.new), ["6", "frank", "NULL", "NULL", "NULL", "NULL"]);
}
