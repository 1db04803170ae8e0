//! The container's command, run for real where the image's rule asks for it
//! ([`crate::scenario::ImageRule::run`]): when the pod starts running, its `args` (split as a
//! shell would) run as a local process with the pod's env, in the pod's own directory, as
//! RunPod runs a container's command. Its output lines become the container's log, and its
//! end is the container's exit (see `lifecycle::process_ended`). A stop sends TERM to its
//! process group (RunPod stops a container with SIGTERM), and KILL 10 s later.
//!
//! Every container has a `/tmp` of its own; these processes share this machine's. So the files
//! the controller's wrapper keeps there ([`WRAPPER_FILES`]) are moved to the pod's own
//! directory in `args`, or one pod's recorded exit code would end the next pod's run.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Where the wrapper keeps its own files (the exit code, that the init containers ran).
const WRAPPER_FILES: &str = "/tmp/runpod-kubelet-exit-code";

/// What a running command produced since it was last looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Output {
    Line(String, Instant),
    Exit(i32, Instant),
}

#[derive(Default)]
struct Run {
    /// The process group of the running command (its pid).
    group: Option<u32>,
    output: Vec<Output>,
}

/// Runs by pod id; a run's output waits here until the pod is advanced.
fn runs() -> &'static Mutex<HashMap<String, Arc<Mutex<Run>>>> {
    static RUNS: OnceLock<Mutex<HashMap<String, Arc<Mutex<Run>>>>> = OnceLock::new();
    RUNS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The pod's own directory (its sshd's sessions run there too).
pub(crate) fn workdir(pod_id: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("runpod-sim-{pod_id}"))
}

/// Starts `args` for the pod (a run still going is stopped first); nothing for empty or
/// unreadable `args`.
pub(crate) fn start(pod_id: &str, args: &str, env: &BTreeMap<String, String>) {
    stop(pod_id);
    let dir = workdir(pod_id);
    let own = dir.join("runpod-kubelet-exit-code").display().to_string();
    let args = args.replace(WRAPPER_FILES, &own);
    let Some(argv) = shlex::split(&args).filter(|argv| !argv.is_empty()) else {
        return;
    };
    let root = dir.join("root");
    let _ = std::fs::create_dir_all(&root);
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .envs(env)
        .env("RUNPOD_POD_ID", pod_id)
        .env("RUNPOD_KUBELET_SSH_ROOT", &root)
        // Never this machine's sshd or system tools (the wrapper starts `sshd` where it finds
        // one; the simulator serves the pod's SSH itself).
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let run = Arc::new(Mutex::new(Run::default()));
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            let now = Instant::now();
            run.lock()
                .unwrap_or_else(|e| e.into_inner())
                .output
                .extend([
                    Output::Line(format!("exec {}: {error}", argv[0]), now),
                    Output::Exit(127, now),
                ]);
            if let Ok(mut all) = runs().lock() {
                all.insert(pod_id.to_owned(), run);
            }
            return;
        }
    };
    run.lock().unwrap_or_else(|e| e.into_inner()).group = Some(child.id());
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let run = run.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                run.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .output
                    .push(Output::Line(line, Instant::now()));
            }
        })
    })
    .collect();
    let waiter = run.clone();
    std::thread::spawn(move || {
        let status = child.wait();
        for reader in readers {
            let _ = reader.join();
        }
        let code = status.ok().and_then(|s| {
            use std::os::unix::process::ExitStatusExt as _;
            s.code().or_else(|| s.signal().map(|signal| 128 + signal))
        });
        let mut run = waiter.lock().unwrap_or_else(|e| e.into_inner());
        run.group = None;
        run.output
            .push(Output::Exit(code.unwrap_or(137), Instant::now()));
    });
    if let Ok(mut all) = runs().lock() {
        all.insert(pod_id.to_owned(), run);
    }
}

/// What the pod's command produced since the last call.
pub(crate) fn drain(pod_id: &str) -> Vec<Output> {
    let run = runs().lock().ok().and_then(|all| all.get(pod_id).cloned());
    run.map(|run| std::mem::take(&mut run.lock().unwrap_or_else(|e| e.into_inner()).output))
        .unwrap_or_default()
}

/// Stops the pod's command, if one runs: TERM to its process group now, KILL 10 s later. Its
/// output is no longer read (the container stopped).
pub(crate) fn stop(pod_id: &str) {
    let run = runs().lock().ok().and_then(|mut all| all.remove(pod_id));
    let Some(group) = run.and_then(|run| run.lock().unwrap_or_else(|e| e.into_inner()).group)
    else {
        return;
    };
    let signal = move |name: &str| {
        let _ = Command::new("kill")
            .args([format!("-{name}"), "--".to_owned(), format!("-{group}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    };
    signal("TERM");
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(10));
        signal("KILL");
    });
}
