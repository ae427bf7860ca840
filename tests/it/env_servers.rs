//! The test servers started by `scripts/env.sh up` are real and configured as
//! the connector needs: logical decoding with pgoutput for the `outbox` role
//! over scram-sha-256, and a Kafka broker that takes idempotent `acks=all`
//! writes and serves them back to a consumer group.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

/// Upper bound for any single wait on a server in these tests.
const WAIT: Duration = Duration::from_secs(60);

async fn outbox_client() -> tokio_postgres::Client {
    let url = common::pg_url();
    let (client, conn) =
        tokio::time::timeout(WAIT, tokio_postgres::connect(&url, tokio_postgres::NoTls))
            .await
            .unwrap_or_else(|_| panic!("connecting as outbox ({url}) took more than {WAIT:?}"))
            .unwrap_or_else(|e| {
                panic!("cannot connect to the test PostgreSQL as outbox ({url}): {e}")
            });
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// `scripts/env.sh` records the major it started (OUTBOX_CDC_PG_VERSION in
/// target/env/test.env): a version matrix that ran on the wrong server would
/// prove nothing.
#[tokio::test]
async fn the_server_is_the_major_the_environment_names() {
    let asked: i32 = std::env::var("OUTBOX_CDC_PG_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect(
            "OUTBOX_CDC_PG_VERSION is not set to a major: source target/env/test.env written by scripts/env.sh up",
        );
    let version: i32 = common::admin_client()
        .await
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server_version_num")
        .get(0);
    assert_eq!(
        version / 10000,
        asked,
        "the environment asked for PostgreSQL {asked}, the server is {version}"
    );
}

#[tokio::test]
async fn outbox_role_creates_and_drops_a_pgoutput_slot() {
    common::init_tracing();
    let client = outbox_client().await;

    let wal_level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .expect("SHOW wal_level")
        .get(0);
    assert_eq!(
        wal_level, "logical",
        "the test cluster must run with wal_level=logical"
    );

    let encryption: String = client
        .query_one("SHOW password_encryption", &[])
        .await
        .expect("SHOW password_encryption")
        .get(0);
    assert_eq!(encryption, "scram-sha-256");

    let slot = common::unique_name("env_slot");
    let row = client
        .query_one(
            "SELECT slot_name::text, lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .unwrap_or_else(|e| panic!("outbox cannot create logical slot {slot}: {e}"));
    let created: String = row.get(0);
    assert_eq!(created, slot);
    let lsn: String = row.get(1);
    assert!(
        lsn.contains('/'),
        "slot {slot} reported a consistent point {lsn:?} that is no LSN"
    );

    let listed = client
        .query_opt(
            "SELECT plugin::text, slot_type, database::text, temporary \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("reading pg_replication_slots");
    let dropped = client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await;

    let listed =
        listed.unwrap_or_else(|| panic!("slot {slot} is missing from pg_replication_slots"));
    let plugin: String = listed.get(0);
    let slot_type: String = listed.get(1);
    let database: Option<String> = listed.get(2);
    let temporary: bool = listed.get(3);
    assert_eq!(plugin, "pgoutput");
    assert_eq!(slot_type, "logical");
    assert_eq!(database.as_deref(), Some("app"));
    assert!(!temporary, "slot {slot} should be persistent");
    dropped.unwrap_or_else(|e| panic!("outbox cannot drop slot {slot}: {e}"));

    let remaining: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("counting slots")
        .get(0);
    assert_eq!(
        remaining, 0,
        "slot {slot} is still there after pg_drop_replication_slot"
    );
}

#[tokio::test]
async fn outbox_role_authenticates_with_a_scram_verifier() {
    let admin = common::admin_client().await;
    let row = admin
        .query_one(
            "SELECT rolpassword, rolcanlogin, rolreplication, rolsuper \
             FROM pg_authid WHERE rolname = 'outbox'",
            &[],
        )
        .await
        .expect("the test cluster has no role `outbox`");
    let verifier: Option<String> = row.get(0);
    let (can_login, replication, superuser): (bool, bool, bool) =
        (row.get(1), row.get(2), row.get(3));
    let verifier = verifier.expect("role outbox has no password");
    assert!(
        verifier.starts_with("SCRAM-SHA-256$"),
        "role outbox must have a SCRAM-SHA-256 verifier, has one starting {:?}",
        verifier.get(..14)
    );
    assert!(
        can_login && replication,
        "role outbox needs LOGIN and REPLICATION"
    );
    assert!(
        !superuser,
        "role outbox must not be a superuser (the tests would prove nothing about grants)"
    );

    // And the URL the connector is given really logs in with that password over TCP.
    let client = outbox_client().await;
    let user: String = client
        .query_one("SELECT current_user::text", &[])
        .await
        .expect("SELECT current_user")
        .get(0);
    assert_eq!(user, "outbox");
}

#[tokio::test]
async fn kafka_round_trips_idempotent_acks_all_records() {
    common::init_tracing();
    let bootstrap = common::kafka_bootstrap();
    let topic = common::unique_name("env_topic");

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin client config");
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Timeout::After(WAIT))),
        )
        .await
        .unwrap_or_else(|e| panic!("creating topic {topic} on {bootstrap}: {e}"));
    for result in created {
        result
            .unwrap_or_else(|(name, code)| panic!("creating topic {name} on {bootstrap}: {code}"));
    }

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer config");
    let expected: BTreeMap<String, String> = (0..10)
        .map(|i| (format!("key-{i}"), format!("value-{i}")))
        .collect();
    let deliveries: Vec<_> = expected
        .iter()
        .map(|(key, value)| {
            let record = FutureRecord::to(&topic)
                .key(key.as_str())
                .payload(value.as_str());
            (key.clone(), producer.send(record, Timeout::After(WAIT)))
        })
        .collect();
    for (key, delivery) in deliveries {
        match tokio::time::timeout(WAIT, delivery).await {
            Ok(Ok(delivered)) => assert!(
                delivered.offset >= 0,
                "record {key} delivered to {topic} without an offset"
            ),
            Ok(Err((e, _))) => panic!("record {key} to {topic} on {bootstrap} failed: {e}"),
            Err(_) => {
                panic!("record {key} to {topic} on {bootstrap} not acknowledged within {WAIT:?}")
            }
        }
    }

    let group = common::unique_name("env_group");
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer config");
    consumer
        .subscribe(&[&topic])
        .unwrap_or_else(|e| panic!("subscribing to {topic}: {e}"));

    let mut received = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while received.len() < expected.len() {
        let message = match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(Ok(message)) => message,
            Ok(Err(e)) => panic!("consuming {topic} with group {group}: {e}"),
            Err(_) => panic!(
                "consumer group {group} read {} of {} records from {topic} within {WAIT:?}: {:?}",
                received.len(),
                expected.len(),
                received.keys().collect::<Vec<_>>()
            ),
        };
        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
        let value = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
        if let Some(previous) = received.insert(key.clone(), value) {
            panic!(
                "record {key} read twice from {topic} (partition {}, offset {}; first value {previous})",
                message.partition(),
                message.offset()
            );
        }
    }
    assert_eq!(
        received, expected,
        "records read back from {topic} differ from those produced"
    );

    // Leave the broker as we found it; a failure here is not the test's subject.
    let _ = admin
        .delete_topics(
            &[&topic],
            &AdminOptions::new().operation_timeout(Some(Timeout::After(WAIT))),
        )
        .await;
}
