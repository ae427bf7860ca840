//! deploy/kubernetes checked without a cluster: every manifest decodes into
//! the Kubernetes API types (k8s-openapi; a ServiceMonitor into the fields of
//! the Prometheus Operator's CRD that it uses) with no field those types lack,
//! and what the manifests say about the binary holds: the probes' paths are
//! served by the connector's HTTP server on the port the configuration listens
//! on, the configuration loads with the Secret's and the pod's environment
//! overrides, the command line, paths, user and image match the Dockerfile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use outbox_cdc::config::Config;
use outbox_cdc::metrics::Metrics;
use serde::de::DeserializeOwned;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Every YAML document of every manifest, with its file name.
fn documents() -> Vec<(String, serde_yaml::Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .expect("deploy/kubernetes")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            docs.push((name.clone(), value));
        }
    }
    docs
}

/// Decodes `value` as `T`, failing on any field `T` does not have.
fn decode<T: DeserializeOwned>(file: &str, value: &serde_yaml::Value) -> T {
    let mut unknown = Vec::new();
    let decoded = serde_ignored::deserialize(value.clone(), |path| unknown.push(path.to_string()))
        .unwrap_or_else(|e| panic!("{file}: not a valid {}: {e}", std::any::type_name::<T>()));
    assert!(
        unknown.is_empty(),
        "{file}: fields the Kubernetes API does not have (misspelled?): {unknown:?}"
    );
    decoded
}

/// The fields of monitoring.coreos.com/v1 ServiceMonitor that we use.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceMonitorSpec {
    selector: LabelSelector,
    endpoints: Vec<ServiceMonitorEndpoint>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceMonitorEndpoint {
    port: String,
    path: String,
    interval: Option<String>,
}

struct Manifests {
    config_map: ConfigMap,
    secret: Secret,
    stateful_set: StatefulSet,
    service: Service,
    monitor: ServiceMonitor,
}

fn manifests() -> Manifests {
    let (mut cm, mut secret, mut sts, mut svc, mut sm) = (None, None, None, None, None);
    for (file, doc) in documents() {
        let kind = doc
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_owned();
        match kind.as_str() {
            "ConfigMap" => cm = Some(decode::<ConfigMap>(&file, &doc)),
            "Secret" => secret = Some(decode::<Secret>(&file, &doc)),
            "StatefulSet" => sts = Some(decode::<StatefulSet>(&file, &doc)),
            "Service" => svc = Some(decode::<Service>(&file, &doc)),
            "ServiceMonitor" => {
                let m: ServiceMonitor = decode(&file, &doc);
                assert_eq!(m.api_version, "monitoring.coreos.com/v1", "{file}");
                assert_eq!(m.kind, "ServiceMonitor");
                sm = Some(m);
            }
            other => panic!("{file}: a {other:?} the test does not know; check it here too"),
        }
    }
    Manifests {
        config_map: cm.expect("a ConfigMap"),
        secret: secret.expect("a Secret"),
        stateful_set: sts.expect("a StatefulSet"),
        service: svc.expect("a Service"),
        monitor: sm.expect("a ServiceMonitor"),
    }
}

fn container(m: &Manifests) -> &Container {
    let pod = m
        .stateful_set
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod spec");
    assert_eq!(pod.containers.len(), 1);
    &pod.containers[0]
}

/// The configuration the pod runs with: the ConfigMap's file, overlaid by the
/// Secret's and the container's OUTBOX_CDC__ variables, as the binary does.
fn pod_config(m: &Manifests) -> Config {
    let text = m
        .config_map
        .data
        .as_ref()
        .and_then(|d| d.get("config.toml"))
        .expect("ConfigMap data config.toml");
    let mut env: BTreeMap<String, String> = m.secret.string_data.clone().unwrap_or_default();
    for var in container(m).env.iter().flatten() {
        env.insert(var.name.clone(), var.value.clone().unwrap_or_default());
    }
    let stray: Vec<&String> = env
        .keys()
        .filter(|k| !k.starts_with("OUTBOX_CDC__") && *k != "RUST_LOG")
        .collect();
    assert!(
        stray.is_empty(),
        "neither OUTBOX_CDC__ overrides nor RUST_LOG: {stray:?}"
    );
    Config::from_sources("configmap config.toml", text, env)
        .unwrap_or_else(|e| panic!("the pod's configuration does not load: {e}"))
}

fn named_port(c: &Container, name: &str) -> i32 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("container has no port named {name}"))
        .container_port
}

#[test]
fn manifests_decode_and_fit_the_binary_and_the_dockerfile() {
    let m = manifests();
    let c = container(&m);
    let config = pod_config(&m);

    // The HTTP server listens where the probes and the Service look.
    let listen: std::net::SocketAddr = config.http.listen.parse().expect("http.listen");
    assert!(
        listen.ip().is_unspecified(),
        "probes cannot reach {listen} from the kubelet"
    );
    let http_port = named_port(c, "http");
    assert_eq!(i32::from(listen.port()), http_port);
    for (probe, path) in [
        (&c.liveness_probe, "/health/live"),
        (&c.readiness_probe, "/health/ready"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("httpGet probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String("http".into()));
    }
    let svc_ports = m
        .service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .expect("ports");
    assert!(
        svc_ports
            .iter()
            .any(|p| p.target_port == Some(IntOrString::String("http".into())))
    );
    let svc_port_names: Vec<&str> = svc_ports.iter().filter_map(|p| p.name.as_deref()).collect();
    for e in &m.monitor.spec.endpoints {
        assert!(
            svc_port_names.contains(&e.port.as_str()),
            "ServiceMonitor port {}",
            e.port
        );
        assert_eq!(e.path, "/metrics");
        assert!(e.interval.is_some());
    }

    // Selectors reach the pods.
    let pod_labels = m
        .stateful_set
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|md| md.labels.clone())
        .expect("pod labels");
    let selects =
        |sel: &BTreeMap<String, String>| sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v));
    assert!(selects(
        m.service.spec.as_ref().unwrap().selector.as_ref().unwrap()
    ));
    let sts_sel = m
        .stateful_set
        .spec
        .as_ref()
        .unwrap()
        .selector
        .match_labels
        .clone()
        .unwrap();
    assert!(selects(&sts_sel));
    let svc_labels = m.service.metadata.labels.clone().unwrap_or_default();
    let sm_sel = m
        .monitor
        .spec
        .selector
        .match_labels
        .clone()
        .unwrap_or_default();
    assert!(
        sm_sel.iter().all(|(k, v)| svc_labels.get(k) == Some(v)),
        "ServiceMonitor selects no Service"
    );
    assert_eq!(m.monitor.metadata.name.as_deref(), Some("outbox-cdc"));

    // Two replicas share the slot: the standby needs allow_slot_ahead.
    assert_eq!(m.stateful_set.spec.as_ref().unwrap().replicas, Some(2));
    assert!(config.postgres.allow_slot_ahead);

    // The command line, the config file's path and the offsets volume.
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"));
    let config_path = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))
        .expect("--config PATH");
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let config_mount = mounts
        .iter()
        .find(|vm| vm.mount_path == *config_path)
        .unwrap_or_else(|| panic!("nothing is mounted at {config_path}"));
    assert_eq!(config_mount.sub_path.as_deref(), Some("config.toml"));
    let offsets_mount = mounts
        .iter()
        .find(|vm| vm.name == "offsets")
        .expect("offsets mount");
    assert!(
        config.offsets.path.starts_with(&offsets_mount.mount_path),
        "offsets.path {} is not on the volume at {}",
        config.offsets.path.display(),
        offsets_mount.mount_path
    );
    let claims = m
        .stateful_set
        .spec
        .as_ref()
        .unwrap()
        .volume_claim_templates
        .clone()
        .unwrap();
    assert!(
        claims
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("offsets"))
    );

    // The image the Dockerfile builds: its name, its user, its paths.
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    let image = c.image.as_deref().expect("image");
    let repo = image.split(':').next().unwrap();
    assert!(
        dockerfile.contains(&format!("docker build -t {repo} .")),
        "the Dockerfile does not build {repo}"
    );
    assert!(dockerfile.contains("ENTRYPOINT [\"outbox-cdc\"]"));
    assert!(dockerfile.contains(&format!("VOLUME [\"{}\"]", offsets_mount.mount_path)));
    let uid = m
        .stateful_set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.security_context.as_ref())
        .and_then(|sc| sc.run_as_user)
        .expect("runAsUser");
    assert!(
        dockerfile.contains(&format!("--uid {uid} ")),
        "the image's user is not uid {uid}"
    );
}

/// The probes' paths answer as the probes expect from the connector's own
/// HTTP server: /health/live while it runs, /health/ready only while
/// streaming (and Kafka answers); the older /healthz and /readyz with them.
#[tokio::test]
async fn probe_paths_are_served_by_the_connector() {
    let m = manifests();
    let c = container(&m);
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap();
    drop(free);
    let metrics = Arc::new(Metrics::default());
    let settings = outbox_cdc::config::HttpSettings {
        listen: addr.to_string(),
        ..Default::default()
    };
    let server = outbox_cdc::http::serve(&settings, metrics.clone())
        .await
        .expect("serve")
        .expect("a server");
    let path = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
        probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .clone()
            .unwrap()
    };
    let (live, ready) = (path(&c.liveness_probe), path(&c.readiness_probe));
    let t = Duration::from_secs(5);
    outbox_cdc::http::get(addr, &live, t)
        .await
        .expect("liveness path answers 200");
    assert!(
        outbox_cdc::http::get(addr, &ready, t).await.is_err(),
        "{ready} must fail while not streaming (a standby is not ready)"
    );
    metrics.set_connected(true);
    metrics.health.kafka_reached();
    outbox_cdc::http::get(addr, &ready, t)
        .await
        .expect("readiness path answers 200 while streaming and Kafka answers");
    for alias in ["/healthz", "/readyz"] {
        outbox_cdc::http::get(addr, alias, t)
            .await
            .expect("the older probe paths answer as before");
    }
    outbox_cdc::http::get(addr, &m.monitor.spec.endpoints[0].path, t)
        .await
        .expect("metrics path");
    server.abort();
}
