//! Golden tests of pgoutput protocol 2 streaming: the messages of streamed
//! transactions captured from a real PostgreSQL by
//! scripts/capture-pgoutput-stream-fixtures.sh (its header describes the
//! workload), one set per major in tests/fixtures/pgoutput-stream-<major>/.
//!
//! Each set is replayed in stream order the way the connector reads it:
//! [`decode`] outside a streamed block, [`decode_streamed`] between Stream
//! Start and Stream Stop. [`walk`] checks what holds for every stream (block
//! framing, the xids changes carry, first segments, Stream Commit fields, the
//! rows' values, agreement with the MANIFEST) and cuts the stream into
//! [`Piece`]s; each step's test then states exactly which pieces the workload
//! produces. Values that depend on the capturing cluster (OIDs, LSNs, xids,
//! times) are checked for consistency; everything the workload determines
//! (rows, their order, block boundaries, which transaction a row belongs to)
//! exactly.
//!
//! What differs between majors: before 15 pgoutput sends a transaction that
//! changed no published table as an empty Begin..Commit ([`walk`] drops
//! those after checking they are empty); 18 drops the changes of an
//! already-aborted transaction that outgrows logical_decoding_work_mem instead
//! of streaming them (the late_rollback step sends nothing), and its rollback
//! step is decoded with debug_logical_replication_streaming = immediate, one
//! block per change (see the capture script).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use outbox_cdc::pg::{Lsn, PgTimestamp};
use outbox_cdc::pgoutput::{
    Begin, Commit, Message, Relation, RelationColumn, StreamAbort, decode, decode_streamed,
};

const MAJORS: [u32; 5] = [14, 15, 16, 17, 18];
const TABLE: &str = "pgoutput_stream_fixture.rows";
/// Built-in type OIDs (pg_type.dat).
const INT4: u32 = 23;
const TEXT: u32 = 25;
/// The padded length of a big row's body (BODY_BYTES in the capture script).
const BODY_BYTES: usize = 6800;

/// One captured message, as listed in the MANIFEST.
struct Fixture {
    file: String,
    step: String,
    lsn: Lsn,
    xid: u32,
    data: Bytes,
}

struct Set {
    major: u32,
    dir: PathBuf,
    version: u32,
    fixtures: Vec<Fixture>,
}

fn set_dir(major: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/pgoutput-stream-{major}"))
}

fn load(major: u32) -> Set {
    let dir = set_dir(major);
    let manifest = std::fs::read_to_string(dir.join("MANIFEST")).unwrap_or_else(|e| {
        panic!(
            "{}/MANIFEST: {e}; capture the set with scripts/capture-pgoutput-stream-fixtures.sh",
            dir.display()
        )
    });
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("# server_version_num "))
        .and_then(|rest| rest.split(';').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}/MANIFEST names no server_version_num", dir.display()));
    let fixtures = manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [file, step, lsn, xid] = fields[..] else {
                panic!("bad MANIFEST line {line:?}")
            };
            let data = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            Fixture {
                file: file.to_owned(),
                step: step.to_owned(),
                lsn: lsn.parse().unwrap_or_else(|e| panic!("{file}: {e}")),
                xid: xid.parse().unwrap_or_else(|e| panic!("{file}: {e}")),
                data: Bytes::from(data),
            }
        })
        .collect();
    Set {
        major,
        dir,
        version,
        fixtures,
    }
}

/// Runs `check` on every major's set, naming the set when it fails.
fn each_major(check: fn(&Set)) {
    for major in MAJORS {
        let set = load(major);
        if let Err(panic) = std::panic::catch_unwind(|| check(&set)) {
            eprintln!("failed on the fixture set {}", set.dir.display());
            std::panic::resume_unwind(panic);
        }
    }
}

/// A row the stream carries: the (sub)transaction that wrote it (for a
/// transaction sent whole, its Begin's xid) and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    xid: u32,
    id: i32,
}

/// A stretch of the stream, as the workload is described.
#[derive(Debug)]
enum Piece {
    /// Begin, a Relation, the rows, Commit: a transaction sent whole.
    Whole {
        begin: Begin,
        rows: Vec<Row>,
    },
    /// Stream Start .. Stream Stop; `relation` when the block describes the
    /// table (a Relation before its first row).
    Block {
        xid: u32,
        first_segment: bool,
        relation: bool,
        rows: Vec<Row>,
    },
    StreamCommit {
        xid: u32,
        commit: Commit,
    },
    StreamAbort(StreamAbort),
}

impl Piece {
    fn rows(&self) -> &[Row] {
        match self {
            Piece::Whole { rows, .. } | Piece::Block { rows, .. } => rows,
            _ => &[],
        }
    }
}

/// The table's Relation: exactly the workload's columns.
fn check_relation(rel: &Relation, file: &str) {
    assert_eq!(rel.qualified_name(), TABLE, "{file}");
    assert_eq!(rel.replica_identity, b'd', "{file}");
    let column = |name: &str, flags, type_oid| RelationColumn {
        flags,
        name: name.to_owned(),
        type_oid,
        type_modifier: -1,
    };
    assert_eq!(
        rel.columns,
        vec![column("id", 1, INT4), column("body", 0, TEXT)],
        "{file}"
    );
}

/// The body the workload gave row `id`.
fn body_of(id: i32) -> String {
    match id {
        100 => "small".to_owned(),
        300 => "warm".to_owned(),
        _ => format!("{:.<BODY_BYTES$}", format!("row {id}")),
    }
}

/// The id of an inserted row, after checking its relation and its body.
fn inserted_row(message: &Message, table_oid: Option<u32>, file: &str) -> i32 {
    let Message::Insert(insert) = message else {
        panic!("{file}: expected an Insert, got {message:?}")
    };
    assert_eq!(
        Some(insert.relation_oid),
        table_oid,
        "{file}: a row of the table described before"
    );
    let values: Vec<&str> = insert
        .new
        .columns
        .iter()
        .map(|c| {
            c.as_str()
                .unwrap_or_else(|| panic!("{file}: not a text value: {c:?}"))
        })
        .collect();
    let [id, body] = values[..] else {
        panic!("{file}: expected (id, body), got {} columns", values.len())
    };
    let id: i32 = id
        .parse()
        .unwrap_or_else(|e| panic!("{file}: id {id:?}: {e}"));
    assert!(body == body_of(id), "{file}: the body of row {id}");
    id
}

/// Replays the set in stream order, checking what holds for any stream, and
/// returns its pieces with their step. Empty transactions (servers before 15)
/// are checked and left out.
fn walk(set: &Set) -> Vec<(String, Piece)> {
    let mut pieces: Vec<(String, Piece)> = Vec::new();
    let mut table_oid: Option<u32> = None;
    // Top-level xid of every streamed transaction: ended (Stream Commit or
    // top-level Stream Abort) or not, and the xids its rows carried.
    let mut streamed: HashMap<u32, (bool, BTreeSet<u32>)> = HashMap::new();
    let mut last_end = Lsn::ZERO;
    let mut last_lsn = Lsn::ZERO;
    let mut messages = set.fixtures.iter().inspect(move |f| {
        assert!(
            f.lsn >= last_lsn,
            "{}: the MANIFEST's LSNs go forward",
            f.file
        );
        last_lsn = f.lsn;
    });
    while let Some(f) = messages.next() {
        let message = decode(&f.data).unwrap_or_else(|e| panic!("{}: {e}", f.file));
        let piece = match message {
            Message::StreamStart(start) => {
                assert_eq!(f.xid, start.xid, "{}: MANIFEST xid", f.file);
                let first_segment = !streamed.contains_key(&start.xid);
                let (ended, _) = streamed.entry(start.xid).or_default();
                assert!(!*ended, "{}: a block after the transaction ended", f.file);
                let mut relation = false;
                let mut relation_xid = None;
                let mut rows = Vec::new();
                loop {
                    let f = messages.next().unwrap_or_else(|| {
                        panic!("the stream ends inside the block of {}", f.file)
                    });
                    assert_eq!(f.xid, start.xid, "{}: MANIFEST xid in a block", f.file);
                    let streamed_message =
                        decode_streamed(&f.data).unwrap_or_else(|e| panic!("{}: {e}", f.file));
                    match (streamed_message.xid, &streamed_message.message) {
                        (None, Message::StreamStop) => break,
                        (Some(xid), Message::Relation(rel)) => {
                            assert!(rows.is_empty(), "{}: a Relation after rows", f.file);
                            assert!(!relation, "{}: a second Relation", f.file);
                            relation_xid = Some(xid);
                            check_relation(rel, &f.file);
                            assert!(
                                table_oid.is_none_or(|oid| oid == rel.oid),
                                "{}: one table, one OID",
                                f.file
                            );
                            table_oid = Some(rel.oid);
                            relation = true;
                        }
                        (Some(xid), Message::Insert(_)) => {
                            // A Relation carries the xid of the change it is sent for.
                            if let Some(rel_xid) = relation_xid.take() {
                                assert_eq!(rel_xid, xid, "{}: the Relation's xid", f.file);
                            }
                            let id = inserted_row(&streamed_message.message, table_oid, &f.file);
                            rows.push(Row { xid, id });
                        }
                        (xid, other) => {
                            panic!("{}: unexpected in a block: {other:?} (xid {xid:?})", f.file)
                        }
                    }
                }
                assert_eq!(
                    start.first_segment, first_segment,
                    "{}: first_segment is set on a transaction's first block only",
                    f.file
                );
                let (_, xids) = streamed.get_mut(&start.xid).expect("entered above");
                xids.extend(rows.iter().map(|r| r.xid));
                Piece::Block {
                    xid: start.xid,
                    first_segment: start.first_segment,
                    relation,
                    rows,
                }
            }
            Message::Begin(begin) => {
                assert_eq!(f.xid, begin.xid, "{}: MANIFEST xid", f.file);
                let mut rows = Vec::new();
                let mut relation = false;
                let commit = loop {
                    let f = messages.next().unwrap_or_else(|| {
                        panic!("the stream ends inside the transaction of {}", f.file)
                    });
                    assert_eq!(f.xid, begin.xid, "{}: MANIFEST xid", f.file);
                    let message = decode(&f.data).unwrap_or_else(|e| panic!("{}: {e}", f.file));
                    match &message {
                        Message::Commit(commit) => {
                            assert_eq!(commit.flags, 0, "{}", f.file);
                            assert_eq!(commit.commit_lsn, begin.final_lsn, "{}", f.file);
                            assert_eq!(commit.commit_time, begin.commit_time, "{}", f.file);
                            assert_eq!(commit.end_lsn, f.lsn, "{}: MANIFEST lsn", f.file);
                            break *commit;
                        }
                        Message::Relation(rel) => {
                            assert!(rows.is_empty() && !relation, "{}", f.file);
                            check_relation(rel, &f.file);
                            assert!(table_oid.is_none_or(|oid| oid == rel.oid), "{}", f.file);
                            table_oid = Some(rel.oid);
                            relation = true;
                        }
                        Message::Insert(_) => {
                            assert!(relation, "{}: a Relation first", f.file);
                            let id = inserted_row(&message, table_oid, &f.file);
                            rows.push(Row { xid: begin.xid, id });
                        }
                        other => panic!("{}: unexpected in a transaction: {other:?}", f.file),
                    }
                };
                check_commit(&commit, &f.file, &mut last_end);
                if rows.is_empty() && !relation {
                    assert!(
                        set.version < 150000,
                        "{}: an empty transaction (only servers before 15 send them)",
                        f.file
                    );
                    continue;
                }
                Piece::Whole { begin, rows }
            }
            Message::StreamCommit(sc) => {
                assert_eq!(f.xid, sc.xid, "{}: MANIFEST xid", f.file);
                assert_eq!(sc.commit.flags, 0, "{}", f.file);
                assert_eq!(sc.commit.end_lsn, f.lsn, "{}: MANIFEST lsn", f.file);
                check_commit(&sc.commit, &f.file, &mut last_end);
                let (ended, _) = streamed.get_mut(&sc.xid).unwrap_or_else(|| {
                    panic!("{}: Stream Commit of a transaction never streamed", f.file)
                });
                assert!(!*ended, "{}: the transaction ended before", f.file);
                *ended = true;
                Piece::StreamCommit {
                    xid: sc.xid,
                    commit: sc.commit,
                }
            }
            Message::StreamAbort(abort) => {
                // The slot function reports an abort under the aborted xid.
                assert_eq!(f.xid, abort.subxid, "{}: MANIFEST xid", f.file);
                let (ended, xids) = streamed.get_mut(&abort.xid).unwrap_or_else(|| {
                    panic!("{}: Stream Abort of a transaction never streamed", f.file)
                });
                assert!(!*ended, "{}: the transaction ended before", f.file);
                if abort.is_top_level() {
                    *ended = true;
                } else {
                    // A subtransaction's xid is assigned after its parent's.
                    assert!(abort.subxid > abort.xid, "{}", f.file);
                    assert!(
                        xids.contains(&abort.subxid),
                        "{}: a subtransaction of the blocks",
                        f.file
                    );
                }
                Piece::StreamAbort(abort)
            }
            other => panic!("{}: unexpected outside a block: {other:?}", f.file),
        };
        pieces.push((f.step.clone(), piece));
    }
    // Every row in a block is its transaction's or a subtransaction's: an xid
    // after the top-level one, never the top-level xid of another transaction.
    for (top, (ended, xids)) in &streamed {
        assert!(ended, "transaction {top} streamed but never ended");
        for xid in xids {
            assert!(
                xid == top || (xid > top && !streamed.contains_key(xid)),
                "row xid {xid} in the blocks of {top}"
            );
        }
    }
    pieces
}

/// What every Commit and Stream Commit satisfies.
fn check_commit(commit: &Commit, file: &str, last_end: &mut Lsn) {
    assert!(commit.commit_lsn < commit.end_lsn, "{file}");
    assert!(commit.end_lsn > *last_end, "{file}: commits go forward");
    *last_end = commit.end_lsn;
    // Captured after 2020 and not in the future.
    let ms = commit.commit_time.unix_millis();
    assert!(ms > 1_577_836_800_000, "{file}: commit time {ms}");
    assert!(
        ms <= PgTimestamp::now().unix_millis(),
        "{file}: commit time {ms}"
    );
}

/// A piece as a step's test expects it, transactions named by letters
/// (bound to the real xids on first use; two letters never share an xid).
#[derive(Debug)]
enum Want {
    Whole(char, Vec<i32>),
    /// xid, first segment, Relation, rows as (xid, ids).
    Block(char, bool, bool, Vec<(char, Vec<i32>)>),
    StreamCommit(char),
    /// xid, aborted (sub)transaction.
    StreamAbort(char, char),
}

/// The step's pieces, after checking they are exactly `want`; returns the
/// letters' xids.
fn expect(set: &Set, step: &str, want: &[Want]) -> HashMap<char, u32> {
    let pieces: Vec<Piece> = walk(set)
        .into_iter()
        .filter(|(s, _)| s == step)
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        pieces.len(),
        want.len(),
        "step {step}: got {pieces:#?}\nwanted {want:#?}"
    );
    let mut names: HashMap<char, u32> = HashMap::new();
    let mut bind = |name: char, xid: u32| {
        let bound = *names.entry(name).or_insert(xid);
        assert_eq!(bound, xid, "step {step}: {name} is xid {bound}, not {xid}");
        let same: Vec<char> = names
            .iter()
            .filter(|(_, x)| **x == xid)
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(same, vec![name], "step {step}: xid {xid} named twice");
    };
    for (piece, want) in pieces.iter().zip(want) {
        let context = format!("step {step}: got {piece:?}, wanted {want:?}");
        match (piece, want) {
            (Piece::Whole { begin, rows }, Want::Whole(name, ids)) => {
                bind(*name, begin.xid);
                let got: Vec<i32> = rows.iter().map(|r| r.id).collect();
                assert_eq!(&got, ids, "{context}");
            }
            (
                Piece::Block {
                    xid,
                    first_segment,
                    relation,
                    rows,
                },
                Want::Block(name, first, rel, want_rows),
            ) => {
                bind(*name, *xid);
                assert_eq!(first_segment, first, "{context}: first_segment");
                assert_eq!(relation, rel, "{context}: a Relation");
                let mut rows = rows.iter();
                for (row_name, ids) in want_rows {
                    for id in ids {
                        let row = rows
                            .next()
                            .unwrap_or_else(|| panic!("{context}: row {id} missing"));
                        assert_eq!(row.id, *id, "{context}");
                        bind(*row_name, row.xid);
                    }
                }
                assert!(rows.next().is_none(), "{context}: more rows");
            }
            (Piece::StreamCommit { xid, .. }, Want::StreamCommit(name)) => bind(*name, *xid),
            (Piece::StreamAbort(abort), Want::StreamAbort(name, sub)) => {
                bind(*name, abort.xid);
                if name == sub {
                    assert!(abort.is_top_level(), "{context}");
                } else {
                    bind(*sub, abort.subxid);
                }
            }
            _ => panic!("{context}"),
        }
    }
    names
}

fn ids(range: std::ops::RangeInclusive<i32>) -> Vec<i32> {
    range.collect()
}

/// The Stream Commit of `xid` in the set.
fn stream_commit(set: &Set, xid: u32) -> Commit {
    walk(set)
        .into_iter()
        .find_map(|(_, p)| match p {
            Piece::StreamCommit { xid: x, commit } if x == xid => Some(commit),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Stream Commit of {xid}"))
}

#[test]
fn every_major_from_14_to_18_has_a_set() {
    for major in MAJORS {
        let set = load(major);
        assert_eq!(set.version / 10000, major, "{}", set.dir.display());
        assert!(!set.fixtures.is_empty(), "{}", set.dir.display());
    }
    // No set this test does not know about.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let sets: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.starts_with("pgoutput-stream-"))
        .collect();
    let known: BTreeSet<String> = MAJORS
        .iter()
        .map(|m| format!("pgoutput-stream-{m}"))
        .collect();
    assert_eq!(sets, known);
}

#[test]
fn files_are_the_manifest_s_in_order() {
    each_major(check_files_are_the_manifest_s_in_order);
}

fn check_files_are_the_manifest_s_in_order(set: &Set) {
    for (i, f) in set.fixtures.iter().enumerate() {
        let tag = char::from(*f.data.first().expect("a message has a tag"));
        assert_eq!(f.file, format!("{:02}_{tag}_{}.bin", i + 1, f.step));
    }
    let listed: BTreeSet<&str> = set.fixtures.iter().map(|f| f.file.as_str()).collect();
    let names: Vec<String> = std::fs::read_dir(&set.dir)
        .expect("fixture dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".bin"))
        .collect();
    let on_disk: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(listed, on_disk, "no stray files");
    let steps: Vec<&str> =
        set.fixtures
            .iter()
            .map(|f| f.step.as_str())
            .fold(Vec::new(), |mut steps, s| {
                if steps.last() != Some(&s) {
                    steps.push(s);
                }
                steps
            });
    let mut expected = vec![
        "interleaved",
        "savepoint_rollback",
        "late_rollback",
        "rollback",
    ];
    if set.major >= 18 {
        // 18 sends nothing for late_rollback (see the module docs).
        expected.retain(|s| *s != "late_rollback");
    }
    assert_eq!(steps, expected);
    let bytes: usize = set.fixtures.iter().map(|f| f.data.len()).sum();
    assert!(bytes < 400_000, "{bytes} bytes: keep the sets small");
}

/// The walk itself checks framing, xids, first segments, commits and rows
/// everywhere; here every step's pieces are accounted for.
#[test]
fn every_message_is_in_a_piece_of_its_step() {
    each_major(check_every_message_is_in_a_piece_of_its_step);
}

fn check_every_message_is_in_a_piece_of_its_step(set: &Set) {
    let pieces = walk(set);
    let steps: BTreeSet<&str> = pieces.iter().map(|(s, _)| s.as_str()).collect();
    let mut expected = BTreeSet::from([
        "interleaved",
        "savepoint_rollback",
        "late_rollback",
        "rollback",
    ]);
    if set.major >= 18 {
        expected.remove("late_rollback");
    }
    assert_eq!(steps, expected);
}

/// (a) Transaction A outgrows the limit at its tenth row: block 1; B,
/// committed meanwhile in another session, is sent whole after it; A's last
/// two rows come in block 2 (not a first segment, the table already
/// described), then its Stream Commit.
#[test]
fn a_streamed_transaction_with_another_committed_between_its_blocks() {
    each_major(check_a_streamed_transaction_with_another_committed_between_its_blocks);
}

fn check_a_streamed_transaction_with_another_committed_between_its_blocks(set: &Set) {
    let names = expect(
        set,
        "interleaved",
        &[
            Want::Block('A', true, true, vec![('A', ids(1..=10))]),
            Want::Whole('B', vec![100]),
            Want::Block('A', false, false, vec![('A', ids(11..=12))]),
            Want::StreamCommit('A'),
        ],
    );
    let commit = stream_commit(set, names[&'A']);
    let b = walk(set)
        .into_iter()
        .find_map(|(_, p)| match p {
            Piece::Whole { begin, .. } if begin.xid == names[&'B'] => Some(begin),
            _ => None,
        })
        .expect("B is sent whole");
    // B began after A and committed first.
    assert!(names[&'B'] > names[&'A']);
    assert!(b.final_lsn < commit.commit_lsn);
    assert!(b.commit_time <= commit.commit_time);
    // Stream Commit's LSNs follow every row of A in the MANIFEST.
    let last_row = set
        .fixtures
        .iter()
        .filter(|f| f.step == "interleaved" && f.xid == names[&'A'] && f.data[0] == b'I')
        .map(|f| f.lsn)
        .max()
        .expect("rows of A");
    assert!(last_row < commit.commit_lsn);
}

/// (b) Row 201, then a savepoint's nine rows: the tenth row streams the
/// transaction, the savepoint's rows carrying their subtransaction's xid.
/// ROLLBACK TO SAVEPOINT: a Stream Abort of that subtransaction only. The
/// savepoint stays, so row 202 is written by a new subtransaction; it comes
/// in a second block, the table described again (pgoutput forgets what it
/// sent a streamed transaction on any abort in it), then the Stream Commit.
#[test]
fn a_rolled_back_savepoint_aborts_its_subtransaction_only() {
    each_major(check_a_rolled_back_savepoint_aborts_its_subtransaction_only);
}

fn check_a_rolled_back_savepoint_aborts_its_subtransaction_only(set: &Set) {
    let names = expect(
        set,
        "savepoint_rollback",
        &[
            Want::Block(
                'T',
                true,
                true,
                vec![('T', vec![201]), ('s', ids(211..=219))],
            ),
            Want::StreamAbort('T', 's'),
            Want::Block('T', false, true, vec![('u', vec![202])]),
            Want::StreamCommit('T'),
        ],
    );
    let commit = stream_commit(set, names[&'T']);
    assert!(commit.commit_lsn < commit.end_lsn);
}

/// (c) Ten rows, then ROLLBACK, decoded afterwards in a new backend: up to 17
/// the transaction is streamed, but the block's first catalog lookup finds it
/// aborted and the block closes empty before its Stream Abort; 18 drops the
/// aborted transaction's changes and sends nothing.
#[test]
fn a_rollback_decoded_late_sends_an_empty_block_or_nothing() {
    each_major(check_a_rollback_decoded_late_sends_an_empty_block_or_nothing);
}

fn check_a_rollback_decoded_late_sends_an_empty_block_or_nothing(set: &Set) {
    if set.major >= 18 {
        expect(set, "late_rollback", &[]);
    } else {
        expect(
            set,
            "late_rollback",
            &[
                Want::Block('L', true, false, vec![]),
                Want::StreamAbort('L', 'L'),
            ],
        );
    }
}

/// (c) Row 300 committed first (it warms the decoding's caches), then rows
/// 301..310 streamed and rolled back: a Stream Abort whose subxid is the
/// transaction's own xid. 18 streams every change in its own block here
/// (debug_logical_replication_streaming = immediate), row 300's transaction
/// and the capture's flushing write included.
#[test]
fn a_rolled_back_streamed_transaction_aborts_whole() {
    each_major(check_a_rolled_back_streamed_transaction_aborts_whole);
}

fn check_a_rolled_back_streamed_transaction_aborts_whole(set: &Set) {
    if set.major >= 18 {
        let mut want = vec![
            Want::Block('W', true, true, vec![('W', vec![300])]),
            Want::StreamCommit('W'),
            Want::Block('C', true, true, vec![('C', vec![301])]),
        ];
        want.extend((302..=310).map(|id| Want::Block('C', false, false, vec![('C', vec![id])])));
        want.extend([
            Want::StreamAbort('C', 'C'),
            // the capture's write to the unpublished table: nothing to send
            Want::Block('F', true, false, vec![]),
            Want::StreamCommit('F'),
        ]);
        expect(set, "rollback", &want);
    } else {
        expect(
            set,
            "rollback",
            &[
                Want::Whole('W', vec![300]),
                Want::Block('C', true, true, vec![('C', ids(301..=310))]),
                Want::StreamAbort('C', 'C'),
            ],
        );
    }
}

/// Every row the workload wrote into a streamed or committed transaction is
/// decoded once, under the (sub)transaction that wrote it.
#[test]
fn each_transaction_carries_exactly_the_rows_it_wrote() {
    each_major(check_each_transaction_carries_exactly_the_rows_it_wrote);
}

fn check_each_transaction_carries_exactly_the_rows_it_wrote(set: &Set) {
    let mut by_xid: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
    for (_, piece) in walk(set) {
        for row in piece.rows() {
            by_xid.entry(row.xid).or_default().push(row.id);
        }
    }
    let mut got: Vec<Vec<i32>> = by_xid.into_values().collect();
    got.sort();
    let mut expected = vec![
        ids(1..=12),
        vec![100],
        vec![201],
        vec![202],
        ids(211..=219),
        vec![300],
        ids(301..=310),
    ];
    expected.sort();
    assert_eq!(got, expected);
}
