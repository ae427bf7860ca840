//! The connector and the reference consumer as child processes, each started
//! with the plan that will end it: a failpoint, a SIGKILL at a random moment,
//! or a SIGTERM (clean exit expected, or death in the shutdown path).

use std::fmt;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// A failpoint plan that has not fired by then is given up (SIGKILL instead):
/// its process may be starved, e.g. while Kafka is down.
pub const FAILPOINT_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a SIGTERM may take to end a process.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Connector,
    Consumer,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Connector => "connector",
            Kind::Consumer => "consumer",
        }
    }

    fn failpoint_var(self) -> &'static str {
        match self {
            Kind::Connector => "OUTBOX_CDC_FAILPOINT",
            Kind::Consumer => "OUTBOX_CDC_CONSUMER_FAILPOINT",
        }
    }
}

pub const CONNECTOR_FAILPOINTS: [&str; 4] = [
    "after-receive",
    "after-produce-before-ack",
    "after-ack-before-persist",
    "after-persist-before-status-update",
];
/// The connector's points around the Kafka transaction's commit: reached only
/// with `[delivery] mode = "exactly-once"` (never in at-least-once mode).
pub const EXACTLY_ONCE_FAILPOINTS: [&str; 2] =
    ["before-kafka-commit", "after-kafka-commit-before-persist"];

/// The connector's points a run plans and requires (besides the shutdown
/// one), in the order its first starts walk them: an exactly-once run walks
/// its transaction points first, so that a short run (10 cycles) reaches them.
pub fn connector_failpoints(exactly_once: bool) -> Vec<&'static str> {
    let mut points = Vec::new();
    if exactly_once {
        points.extend(EXACTLY_ONCE_FAILPOINTS);
    }
    points.extend(CONNECTOR_FAILPOINTS);
    points
}

/// Armed together with a SIGTERM.
pub const CONNECTOR_SHUTDOWN_FAILPOINT: &str = "during-shutdown";
pub const CONSUMER_FAILPOINTS: [&str; 4] = [
    "after-receive",
    "before-business-commit",
    "after-business-commit-before-offset-commit",
    "after-offset-commit",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Dies by SIGKILL at the point's n-th hit.
    Failpoint { point: &'static str, n: u64 },
    /// SIGKILL from the harness `after` the start.
    Kill { after: Duration },
    /// SIGTERM `after` the start; a clean exit (status 0) is expected.
    Term { after: Duration },
    /// SIGTERM with `during-shutdown` armed: the shutdown path dies by SIGKILL.
    TermInShutdown { after: Duration },
    /// Runs until the harness stops it.
    Steady,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::Failpoint { point, n } => write!(f, "failpoint {point}:{n}"),
            Plan::Kill { after } => write!(f, "kill -9 after {} ms", after.as_millis()),
            Plan::Term { after } => write!(f, "SIGTERM after {} ms", after.as_millis()),
            Plan::TermInShutdown { after } => {
                write!(
                    f,
                    "SIGTERM after {} ms with {CONNECTOR_SHUTDOWN_FAILPOINT}:1",
                    after.as_millis()
                )
            }
            Plan::Steady => write!(f, "steady"),
        }
    }
}

/// How a process ended, as the plan expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// Killed itself at this failpoint.
    Failpoint(&'static str),
    /// Killed by the harness (a random moment, or a failpoint never reached).
    Killed { failpoint_missed: bool },
    /// Exited with status 0 after SIGTERM.
    Clean,
}

/// How to start either process.
#[derive(Clone)]
pub struct Launcher {
    pub connector_config: PathBuf,
    pub consumer_args: Vec<String>,
    pub dir: PathBuf,
    /// `OUTBOX_CDC_SABOTAGE` for every connector start (a `failpoints`
    /// build's deliberate fault, e.g. `drop-insert-every:97`).
    pub sabotage: Option<String>,
}

impl Launcher {
    pub fn log_path(&self, kind: Kind) -> PathBuf {
        self.dir.join(format!("{}.log", kind.name()))
    }

    pub fn spawn(&self, kind: Kind, plan: Plan, incarnation: u32) -> Proc {
        let log_path = self.log_path(kind);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("open {}: {e}", log_path.display()));
        let _ = writeln!(log, "=== chaos: {} #{incarnation}: {plan} ===", kind.name());
        let mut command = match kind {
            Kind::Connector => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"));
                c.args(["run", "--config"]).arg(&self.connector_config);
                c
            }
            Kind::Consumer => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_reference-consumer"));
                c.args(&self.consumer_args);
                c
            }
        };
        command
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("OUTBOX_CDC_FAILPOINT")
            .env_remove("OUTBOX_CDC_CONSUMER_FAILPOINT")
            .env_remove("OUTBOX_CDC_SABOTAGE");
        if let (Kind::Connector, Some(sabotage)) = (kind, &self.sabotage) {
            command.env("OUTBOX_CDC_SABOTAGE", sabotage);
        }
        // Each connector serves /metrics on its own loopback port (the config
        // file, shared by every start, has none): the harness reads its
        // acknowledged offset there while it runs and holds the offset store.
        let metrics = (kind == Kind::Connector).then(free_loopback_address);
        if let Some(addr) = metrics {
            command.env("OUTBOX_CDC__HTTP__LISTEN", addr.to_string());
        }
        match plan {
            Plan::Failpoint { point, n } => {
                command.env(kind.failpoint_var(), format!("{point}:{n}"));
            }
            Plan::TermInShutdown { .. } => {
                command.env(
                    kind.failpoint_var(),
                    format!("{CONNECTOR_SHUTDOWN_FAILPOINT}:1"),
                );
            }
            _ => {}
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {}: {e}", kind.name()));
        let mut proc = Proc::from_child(kind, child, plan, incarnation);
        proc.metrics = metrics;
        proc
    }
}

/// A loopback address for a connector's `/metrics` that nothing listens on
/// now. The port is taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768-60999 by default), and each call
/// tries the next one: a port from that range (bind to port 0, then release)
/// could be handed out as some client's source port before the connector
/// binds it, and the connector refuses to start when its listener fails.
fn free_loopback_address() -> SocketAddr {
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 12_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // A different start per test process, so that two runs on one machine
    // (chaos and chaos_partitioned, say) do not walk the same ports.
    let seed = (std::process::id() % u32::from(COUNT)) as u16;
    for _ in 0..COUNT {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FIRST + (seed.wrapping_add(n) % COUNT);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!(
        "no free loopback port in {FIRST}..{} for a connector's /metrics",
        FIRST + COUNT
    )
}

impl Launcher {
    /// Runs `outbox-cdc repair` to completion (the slot was lost); its log
    /// goes to the connector's. Returns whether it succeeded.
    pub fn repair(&self) -> Result<(), String> {
        let log_path = self.log_path(Kind::Connector);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("open {}: {e}", log_path.display()))?;
        let _ = writeln!(log, "=== chaos: outbox-cdc repair ===");
        let status = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
            .args(["repair", "--config"])
            .arg(&self.connector_config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("OUTBOX_CDC_FAILPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .status()
            .map_err(|e| format!("run outbox-cdc repair: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "outbox-cdc repair failed ({status}); see {}",
                log_path.display()
            ))
        }
    }
}

/// One started process and what the harness has done to it. Its plan may be
/// changed only while the harness has not acted on it yet and the process
/// still runs ([`Proc::replan`]); how it ended is always judged by the plan
/// it was actually carried out under.
pub struct Proc {
    pub kind: Kind,
    child: Option<Child>,
    /// How it ended, once seen outside [`Proc::poll`] (by [`Proc::ended`]),
    /// until `poll` reports it.
    exit: Option<ExitStatus>,
    plan: Plan,
    pub started: Instant,
    terminated_at: Option<Instant>,
    pub incarnation: u32,
    /// The connector's `/metrics` address (`None` for the consumer).
    pub metrics: Option<SocketAddr>,
}

/// Why [`Proc::replan`] refused: the old plan stays, and so does the way the
/// process will be judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replan {
    /// The harness already sent it SIGTERM, as its plan said: it is stopping
    /// (or has stopped) and must end as that plan expects.
    Signalled,
    /// It has ended already (not reported yet by [`Proc::poll`]).
    Ended,
}

impl Proc {
    /// A started process under `plan`.
    pub fn from_child(kind: Kind, child: Child, plan: Plan, incarnation: u32) -> Proc {
        Proc {
            kind,
            child: Some(child),
            exit: None,
            plan,
            started: Instant::now(),
            terminated_at: None,
            incarnation,
            metrics: None,
        }
    }

    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// Whether the harness has sent it SIGTERM.
    pub fn signalled(&self) -> bool {
        self.terminated_at.is_some()
    }

    /// Whether it has ended (killed by the harness, or exited by itself;
    /// an exit not yet reported is kept for [`Proc::poll`]). Does not carry
    /// the plan forward.
    pub fn ended(&mut self) -> Result<bool, String> {
        if self.exit.is_some() {
            return Ok(true);
        }
        let Some(child) = self.child.as_mut() else {
            return Ok(true);
        };
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("wait for the {}: {e}", self.kind.name()))?
        {
            self.child = None;
            self.exit = Some(status);
            return Ok(true);
        }
        Ok(false)
    }

    /// Replaces the plan of a process the harness has not acted on yet. A
    /// process already sent SIGTERM, or already ended, keeps its plan: it
    /// is judged by what was done to it.
    pub fn replan(&mut self, plan: Plan) -> Result<(), Replan> {
        if self.signalled() {
            return Err(Replan::Signalled);
        }
        if self.ended().unwrap_or(true) {
            return Err(Replan::Ended);
        }
        self.plan = plan;
        Ok(())
    }

    /// Carries the plan forward; returns how the process ended once it has.
    pub fn poll(&mut self) -> Result<Option<Death>, String> {
        if let Some(status) = self.exit.take() {
            return self.judge(status).map(Some);
        }
        let Some(child) = self.child.as_mut() else {
            return Err(format!(
                "{} #{} polled after it ended",
                self.kind.name(),
                self.incarnation
            ));
        };
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("wait for the {}: {e}", self.kind.name()))?
        {
            self.child = None;
            return self.judge(status).map(Some);
        }
        let age = self.started.elapsed();
        match (self.plan, self.terminated_at) {
            (Plan::Kill { after }, _) if age >= after => Ok(Some(self.kill9(false))),
            (Plan::Failpoint { .. }, _) if age >= FAILPOINT_TIMEOUT => Ok(Some(self.kill9(true))),
            (Plan::Term { after } | Plan::TermInShutdown { after }, None) if age >= after => {
                self.sigterm();
                Ok(None)
            }
            (_, Some(at)) if at.elapsed() > STOP_TIMEOUT => {
                self.kill9(false);
                Err(format!(
                    "{} #{} ({}) did not stop within {STOP_TIMEOUT:?} after SIGTERM",
                    self.kind.name(),
                    self.incarnation,
                    self.plan
                ))
            }
            _ => Ok(None),
        }
    }

    fn judge(&self, status: ExitStatus) -> Result<Death, String> {
        let killed = status.signal() == Some(9);
        let termed = self.terminated_at.is_some();
        let verdict = match self.plan {
            Plan::Failpoint { point, .. } if killed => Some(Death::Failpoint(point)),
            Plan::TermInShutdown { .. } if termed && killed => {
                Some(Death::Failpoint(CONNECTOR_SHUTDOWN_FAILPOINT))
            }
            Plan::Term { .. } if termed && status.success() => Some(Death::Clean),
            _ => None,
        };
        verdict.ok_or_else(|| {
            format!(
                "{} #{} ({}) ended unexpectedly: {status}{}",
                self.kind.name(),
                self.incarnation,
                self.plan,
                if termed { " after SIGTERM" } else { "" }
            )
        })
    }

    fn sigterm(&mut self) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        self.terminated_at = Some(Instant::now());
    }

    fn kill9(&mut self, failpoint_missed: bool) -> Death {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Death::Killed { failpoint_missed }
    }

    /// SIGKILL now, whatever the plan (end of the chaos phase).
    pub fn abandon(&mut self) {
        self.kill9(false);
    }

    /// SIGTERM and wait for a clean exit.
    pub async fn stop(&mut self) -> Result<(), String> {
        self.sigterm();
        loop {
            let exited = match (self.exit.take(), self.child.as_mut()) {
                (Some(status), _) => Some(status),
                (None, Some(child)) => child.try_wait().map_err(|e| e.to_string())?,
                (None, None) => {
                    return Err(format!(
                        "{} #{} already ended",
                        self.kind.name(),
                        self.incarnation
                    ));
                }
            };
            if let Some(status) = exited {
                self.child = None;
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "{} #{} exited with {status} after SIGTERM",
                        self.kind.name(),
                        self.incarnation
                    ))
                };
            }
            if self
                .terminated_at
                .is_some_and(|t| t.elapsed() > STOP_TIMEOUT)
            {
                self.kill9(false);
                return Err(format!(
                    "{} #{} did not stop within {STOP_TIMEOUT:?}",
                    self.kind.name(),
                    self.incarnation
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9(false);
    }
}

/// The last `lines` lines of a log, for failure messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
