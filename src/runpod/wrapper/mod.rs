//! The completion wrapper. RunPod restarts a container whose process exits (its pods are meant
//! to run until stopped), so a batch container would run again and again. The wrapper runs the
//! pod's command under `sh`, prints `runpod-kubelet: exit-code=<N>` as its last line, and stops
//! its own RunPod pod through the pod-scoped key RunPod injects (`runpodctl` and
//! `$RUNPOD_POD_ID`). The controller sees the pod EXITED in its list and reads the code from the
//! log. If the self-stop fails, the wrapper just ends: RunPod restarts the container and the
//! controller, seeing the uptime go back, still finds the code in the log.
//!
//! The wrapper's `sh` is the container's PID 1, and the kernel drops a signal to PID 1 that has
//! no handler, so without help a stop's SIGTERM would never reach the command (it would only be
//! killed at the end of the grace period). The wrapper therefore runs the command as a
//! background child, traps TERM and INT, passes them on to the child and waits again until the
//! child has really ended (a trap cuts a `wait` short). One limit of POSIX sh remains: a
//! background command starts with INT ignored, so INT reaches only programs that install their
//! own INT handler (Python's `signal.signal`, Go's `signal.Notify`, Node's `process.on`), not a
//! plain `sh` or Python's default `KeyboardInterrupt`. TERM is not affected. The command's stdin
//! is `/dev/null`, as for any background command (Kubernetes `stdin` is not supported anyway).
//!
//! The pod's command replaces the image's CMD, and with it the start script that RunPod's images
//! start sshd from; so, as that script does, the wrapper starts the image's `sshd` with
//! `$PUBLIC_KEY` authorized (for `kubectl exec`) when both exist, and carries on without. That
//! sshd answers on a public port, so it runs with a configuration of the wrapper's own, never
//! the image's: public keys only (no password, keyboard-interactive or empty-password login,
//! whatever the image's `sshd_config` allows), and only the keys in `$PUBLIC_KEY` (the node's,
//! and the pod's own where the pod set one), not any baked into the image. Once it runs, the
//! wrapper prints each host key's SHA-256 fingerprint (`runpod-kubelet: ssh-host-key=SHA256:…`):
//! the controller reads them through the cloud's authenticated log API and connects only to a
//! server holding one of them. The host key is the container's own, made at its first start
//! (an image's baked-in keys are shared by every container of that image).
//!
//! Where the self-stop fails, the restarted container must not run the command again: before
//! reporting, the wrapper writes the code to [`EXIT_MARKER`], and a wrapper that finds that file
//! at start reports the same code again, tries the self-stop again and exits with it, without
//! running the command (or writing the volume files).

mod inits;

pub(crate) use inits::{
    CONTAINER_PREFIX, INIT_EXIT_PREFIX, INITIALIZED, Inits, LogOwner, init_progress,
};

/// Where the wrapper records the code of a run that ended: on the container disk, not on a
/// volume. The restart RunPod makes when the container's process exits is taken to keep the
/// container, as the completion design already assumes for its log (where the controller finds
/// the code after such a restart), and with it the writable layer that `/tmp` belongs to; were
/// the layer renewed, the marker would be gone and the command would run again, as without it.
/// RunPod wipes the container disk when the pod is stopped and started or reset, and the
/// controller never starts a RunPod pod again for another run, so a marker does not outlive its
/// run. Not the volume mount (`/workspace`): it may be a network volume that other pods share
/// and that outlives the pod, where a marker would keep a later pod's command from running.
/// `/tmp` rather than `/` because an image's non-root user can write there.
pub(crate) const EXIT_MARKER: &str = "/tmp/runpod-kubelet-exit-code";

/// `$0` of the wrapper script, so `ps` shows what runs.
const SCRIPT_NAME: &str = "runpod-kubelet-wrapper";

/// The start of every script that reports a code (after `marker=<path>`, before the volume
/// files are written): the helpers below, and the replay of a code already recorded. Function
/// names carry a prefix so that a command named like one of them (`"$@"` looks up functions
/// first) still runs the program.
///
/// - `runpod_kubelet_finish CODE` records the code (written aside, then renamed, so a restart
///   never finds half a file), prints the exit line, stops the pod and exits with the code.
/// - `runpod_kubelet_run WORDS...` runs the words as a background child until it has ended, its
///   code in `$rc`. A signal that came while no child ran is passed to the next one as it starts.
///   A `wait` during which a trap ran is repeated (the trap may have cut it short); should the
///   child have ended just before the trap, the repeated `wait` returns the same code again in
///   dash, busybox ash and bash.
/// - `$signal` is the last signal received, so `OnFailure` does not start another attempt.
const PRELUDE: &str = r#"runpod_kubelet_stop_self() {
  if [ -n "${RUNPOD_POD_ID:-}" ] && command -v runpodctl >/dev/null 2>&1; then
    runpodctl stop pod "$RUNPOD_POD_ID" >/dev/null 2>&1
  fi
}
runpod_kubelet_finish() {
  { printf '%s\n' "$1" >"$marker.new" && mv -f "$marker.new" "$marker"; } 2>/dev/null
  echo "runpod-kubelet: exit-code=$1"
  runpod_kubelet_stop_self
  exit "$1"
}
if [ -f "$marker" ] && read -r code <"$marker"; then
  runpod_kubelet_finish "$code"
fi
"#;

/// Starts the image's sshd for the node's key (see [`PRELUDE`]): pods that end, and pods that
/// run forever whose probes or `preStop` hook run over SSH.
const SSHD: &str = r#"runpod_kubelet_host_key() {
  set -- $(ssh-keygen -E sha256 -lf "$1" 2>/dev/null)
  case "${2:-}" in SHA256:*) echo "runpod-kubelet: ssh-host-key=$2" ;; esac
}
runpod_kubelet_sshd() {
  [ -n "${PUBLIC_KEY:-}" ] || return 0
  sshd=$(command -v sshd 2>/dev/null) || return 0
  etc="${RUNPOD_KUBELET_SSH_ROOT:-}/etc/ssh"
  own="$etc/runpod-kubelet"
  mkdir -p /run/sshd 2>/dev/null
  { mkdir -p "$own" && chmod 700 "$own" &&
    printf '%s\n' "$PUBLIC_KEY" >"$own/authorized_keys" && chmod 600 "$own/authorized_keys" &&
    { [ -f "$own/ssh_host_ed25519_key" ] ||
      ssh-keygen -q -t ed25519 -N '' -f "$own/ssh_host_ed25519_key"; }; } >/dev/null 2>&1 || return 0
  { for key in "$own"/ssh_host_*_key; do [ -f "$key" ] && echo "HostKey $key"; done
    printf '%s\n' 'PasswordAuthentication no' 'ChallengeResponseAuthentication no' \
      'PermitEmptyPasswords no' 'PubkeyAuthentication yes' 'HostbasedAuthentication no' \
      'PermitRootLogin prohibit-password' "AuthorizedKeysFile $own/authorized_keys" \
      'AuthorizedKeysCommand none' 'X11Forwarding no' 'PrintMotd no' \
      'AllowTcpForwarding yes' 'GatewayPorts clientspecified' \
      'Subsystem sftp internal-sftp'; } >"$own/sshd_config" 2>/dev/null || return 0
  "$sshd" -f "$own/sshd_config" >/dev/null 2>&1 || return 0
  for key in "$own"/ssh_host_*_key.pub; do
    [ -f "$key" ] && runpod_kubelet_host_key "$key"
  done
  return 0
}
runpod_kubelet_sshd
"#;

/// Running the command as a background child with signals passed on (see [`PRELUDE`]), and
/// its `postStart` hook: `runpod_kubelet_main WORDS...` starts the words, starts the hook (in
/// `$post_start`, shell words; set by the script, never taken from the environment) beside
/// them, and waits for the words (a signal still reaches them while the hook runs; a hook still
/// running when they end is stopped). A hook that fails prints [`POST_START_FAILED_PREFIX`]
/// with its code and stops the command with TERM, as the kubelet kills a container whose
/// `postStart` failed; the hook's own output is not the container's.
const RUNNING: &str = r#"child= pending= signal= caught=
runpod_kubelet_forward() {
  signal=$1 caught=1
  if [ -n "$child" ]; then kill -s "$1" "$child" 2>/dev/null; else pending=$1; fi
}
trap 'runpod_kubelet_forward TERM' TERM
trap 'runpod_kubelet_forward INT' INT
runpod_kubelet_start() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "exec: \"$1\": executable file not found in \$PATH" >&2
    rc=127
    return 1
  fi
  "$@" &
  child=$!
  if [ -n "$pending" ]; then kill -s "$pending" "$child" 2>/dev/null; pending=; fi
}
runpod_kubelet_wait() {
  while :; do
    caught=
    wait "$child"; rc=$?
    [ -n "$caught" ] || break
  done
  child=
}
runpod_kubelet_run() {
  runpod_kubelet_start "$@" || return 0
  runpod_kubelet_wait
}
runpod_kubelet_main() {
  runpod_kubelet_start "$@" || return 0
  hook=
  if [ -n "$post_start" ]; then
    (
      ( eval "$post_start" ) </dev/null >/dev/null 2>&1
      code=$?
      if [ "$code" -ne 0 ]; then
        echo "runpod-kubelet: post-start-hook-failed=$code"
        # Once more a second later: a TERM that reached the child before it ran its command
        # (between fork and exec) went to the wrapper's own trap there.
        kill -s TERM "$child" 2>/dev/null
        sleep 1
        kill -s TERM "$child" 2>/dev/null
      fi
    ) &
    hook=$!
  fi
  runpod_kubelet_wait
  if [ -n "$hook" ]; then kill "$hook" 2>/dev/null; wait "$hook" 2>/dev/null; fi
}
"#;

/// Run once, report, stop (restartPolicy Never).
const RUN_ONCE: &str = r#"runpod_kubelet_main "$@"
runpod_kubelet_finish "$rc""#;

/// Run until it succeeds, reporting every exit, then stop (restartPolicy OnFailure). A signal
/// ends the loop: the attempt it stopped is the last, and a signal during the pause between
/// attempts ends the pause at once.
const UNTIL_SUCCESS: &str = r#"while :; do
  runpod_kubelet_main "$@"; code=$rc
  [ "$code" -eq 0 ] && break
  [ -n "$signal" ] && break
  echo "runpod-kubelet: exit-code=$code"
  runpod_kubelet_run sleep 10
  [ -n "$signal" ] && break
done
runpod_kubelet_finish "$code""#;

/// Run until it ends, its `postStart` hook beside it, and end with its code (restartPolicy
/// Always with a hook or a shell: the cloud restarts the container, as without one).
const FOREVER_HOOKED: &str = r#"runpod_kubelet_main "$@"
exit "$rc""#;

/// What the wrapper prints when the `postStart` hook failed, before the hook's exit code.
pub(crate) const POST_START_FAILED_PREFIX: &str = "runpod-kubelet: post-start-hook-failed=";

/// What the wrapper prints before each host key fingerprint.
pub(crate) const HOST_KEY_PREFIX: &str = "runpod-kubelet: ssh-host-key=";

/// Whether `line` is one of the wrapper's host-key lines.
pub(crate) fn is_host_key_line(line: &str) -> bool {
    line.trim().starts_with(HOST_KEY_PREFIX)
}

/// Whether `line` is one of the wrapper's markers (host keys, exit codes): read by the
/// controller, kept out of `kubectl logs`.
pub(crate) fn is_marker_line(line: &str) -> bool {
    let line = line.trim();
    is_run_marker(line)
        || line.starts_with(CONTAINER_PREFIX)
        || line.starts_with(INIT_EXIT_PREFIX)
        || line == INITIALIZED
}

/// The markers of every wrapped run (host keys, exit codes, a failed hook), not the init
/// containers' own.
fn is_run_marker(line: &str) -> bool {
    let line = line.trim();
    is_host_key_line(line)
        || line.starts_with(crate::provider::EXIT_CODE_PREFIX)
        || line.starts_with(POST_START_FAILED_PREFIX)
}

/// The code of the `postStart` hook that failed, if one did, from the wrapper's lines.
pub(crate) fn post_start_failure<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<i32> {
    lines
        .into_iter()
        .filter_map(|line| line.trim().strip_prefix(POST_START_FAILED_PREFIX))
        .filter_map(|code| code.trim().parse().ok())
        .last()
}

/// The SSH host key fingerprints a container printed when its sshd started: the wrapper's
/// lines, or the `ssh-keygen -lf` lines RunPod's own start script prints for the images whose
/// start script runs (`256 SHA256:… root@host (ED25519)`). Each once, in order.
pub(crate) fn host_key_fingerprints<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for line in lines {
        let line = line.trim();
        let key = match line.strip_prefix(HOST_KEY_PREFIX) {
            Some(key) => Some(key.trim()),
            None => {
                let words: Vec<&str> = line.split_whitespace().collect();
                let keygen = words.len() >= 3
                    && words[0].parse::<u32>().is_ok()
                    && words
                        .last()
                        .is_some_and(|kind| kind.starts_with('(') && kind.ends_with(')'));
                keygen.then(|| words[1])
            }
        };
        let Some(key) = key.filter(|key| {
            key.strip_prefix("SHA256:").is_some_and(|b64| {
                !b64.is_empty()
                    && b64
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=')
            })
        }) else {
            continue;
        };
        if !keys.iter().any(|known| known == key) {
            keys.push(key.to_owned());
        }
    }
    keys
}

/// How a pod's container ends, from its `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// `Never`: run once.
    RunOnce,
    /// `OnFailure`: run again after a failure, end after a success.
    UntilSuccess,
    /// `Always`: never ends; RunPod's own restarts do the job, no wrapper.
    Forever,
}

/// Prefix of the env vars that carry mounted files' contents (base64), one per file.
pub(crate) const FILE_ENV_PREFIX: &str = "RUNPOD_KUBELET_FILE_";

/// Exit code reported when the volume files cannot be written (as a shell reports a command
/// that cannot run).
pub(crate) const SETUP_FAILED_CODE: i32 = 126;

/// A file the wrapper writes before the command runs.
pub(crate) struct FileToWrite<'a> {
    pub path: &'a str,
    pub content: &'a [u8],
    pub mode: u32,
}

/// Shell that writes a pod's mounted files, and the env that carries their contents. Contents
/// travel in env, never in `args`, so they are not in the command line RunPod shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setup {
    script: String,
    pub env: std::collections::BTreeMap<String, String>,
}

impl Setup {
    /// `None` when there is nothing to write.
    pub(crate) fn new(
        files: &[FileToWrite<'_>],
        directories: &[String],
    ) -> Result<Option<Setup>, String> {
        use base64::Engine as _;
        if files.is_empty() && directories.is_empty() {
            return Ok(None);
        }
        let quote = |text: &str| {
            shlex::try_quote(text)
                .map(|q| q.into_owned())
                .map_err(|e| format!("path {text:?}: {e}"))
        };
        let mut steps = Vec::new();
        let mut env = std::collections::BTreeMap::new();
        for directory in directories {
            steps.push(format!("mkdir -p {}", quote(directory)?));
        }
        for (index, file) in files.iter().enumerate() {
            let var = format!("{FILE_ENV_PREFIX}{index}");
            let parent = file.path.rsplit_once('/').map_or("/", |(dir, _)| dir);
            let parent = if parent.is_empty() { "/" } else { parent };
            let path = quote(file.path)?;
            steps.push(format!(
                "mkdir -p {parent} && printf '%s' \"${var}\" | base64 -d > {path} && chmod {mode:o} {path}",
                parent = quote(parent)?,
                mode = file.mode & 0o777,
            ));
            env.insert(
                var,
                base64::engine::general_purpose::STANDARD.encode(file.content),
            );
        }
        let unset: Vec<&str> = env.keys().map(String::as_str).collect();
        let script = format!(
            "runpod_kubelet_setup() {{\n  {steps}\n}}\n\
             runpod_kubelet_setup || {{ echo \"runpod-kubelet: could not write the pod's volume files \
             (the image needs sh, mkdir, base64 and a writable filesystem)\" >&2; \
             runpod_kubelet_setup_failed=1; set -- sh -c 'exit {SETUP_FAILED_CODE}'; }}\n{unset}",
            steps = steps.join(" &&\n  "),
            unset = if unset.is_empty() {
                String::new()
            } else {
                format!("unset {}\n", unset.join(" "))
            },
        );
        Ok(Some(Setup { script, env }))
    }
}

/// The v2 `args` string that runs `words` under the wrapper, or `None` when the pod is not
/// wrapped (nothing to set up and no command to wrap, or it runs forever anyway). With a
/// `setup`, the files are written first; a pod that needs files but has no command cannot be
/// wrapped, which is an error (the image's own CMD is unknown here).
///
/// `shell`: a pod that runs forever starts the image's sshd for the node's key too (its probes
/// or `preStop` hook run over SSH); pods that end always do.
pub(crate) fn wrapped_args(
    words: &[String],
    completion: Completion,
    setup: Option<&Setup>,
    post_start: Option<&[String]>,
    shell: bool,
    inits: Option<&Inits>,
) -> Result<Option<String>, String> {
    wrapped_args_hooked(
        words,
        completion,
        setup,
        (post_start, shell, inits),
        EXIT_MARKER,
    )
}

/// [`wrapped_args`] without a hook, with the exit marker at `marker` (tests use a directory of
/// their own).
#[cfg(test)]
fn wrapped_args_at(
    words: &[String],
    completion: Completion,
    setup: Option<&Setup>,
    marker: &str,
) -> Result<Option<String>, String> {
    wrapped_args_hooked(words, completion, setup, (None, false, None), marker)
}

/// [`wrapped_args`] with the exit marker at `marker`.
fn wrapped_args_hooked(
    words: &[String],
    completion: Completion,
    setup: Option<&Setup>,
    (post_start, shell, inits): (Option<&[String]>, bool, Option<&Inits>),
    marker: &str,
) -> Result<Option<String>, String> {
    let post_start = post_start.filter(|hook| !hook.is_empty());
    let forever_wrapped = post_start.is_some() || shell || inits.is_some();
    // Always assigned: an env var of the same name must never run as a hook.
    let hook = match post_start {
        Some(hook) => {
            let joined =
                shlex::try_join(hook.iter().map(String::as_str)).map_err(|e| e.to_string())?;
            format!(
                "post_start={}\n",
                shlex::try_quote(&joined).map_err(|e| e.to_string())?
            )
        }
        None => "post_start=\n".to_owned(),
    };
    let body = match (completion, forever_wrapped) {
        (Completion::Forever, false) => "exec \"$@\"",
        (Completion::Forever, true) => FOREVER_HOOKED,
        (Completion::RunOnce, _) => RUN_ONCE,
        (Completion::UntilSuccess, _) => UNTIL_SUCCESS,
    };
    if words.is_empty() {
        return match setup {
            None if inits.is_some() => Err(
                "the pod has init containers, which run in its container before the \
                 container's command, but the container sets no command or args: set \
                 `command` (the image's entrypoint)"
                    .into(),
            ),
            None => Ok(None),
            Some(_) => Err(
                "the pod mounts configMap, secret, downwardAPI or emptyDir volumes, \
                 which are written by a wrapper around the container's command, but the \
                 container sets no command or args: set `command` (the image's entrypoint)"
                    .into(),
            ),
        };
    }
    let prelude = match completion {
        Completion::Forever if !forever_wrapped => String::new(),
        Completion::Forever if shell => format!("{hook}{SSHD}{RUNNING}"),
        Completion::Forever => format!("{hook}{RUNNING}"),
        Completion::RunOnce | Completion::UntilSuccess => {
            let marker = shlex::try_quote(marker).map_err(|e| format!("marker {marker:?}: {e}"))?;
            format!("marker={marker}\n{hook}{PRELUDE}{SSHD}{RUNNING}")
        }
    };
    // Always assigned before the setup: an env var of the same name must not skip them.
    let inits = match inits {
        Some(inits) => inits.script(completion, &format!("{marker}-initialized"))?,
        None => String::new(),
    };
    let reset = if inits.is_empty() {
        ""
    } else {
        "runpod_kubelet_setup_failed=\n"
    };
    let script = match (setup, completion) {
        (None, Completion::Forever) if !forever_wrapped => return Ok(None),
        (None, _) => format!("{prelude}{reset}{inits}{body}"),
        (Some(setup), _) => format!("{prelude}{reset}{}{inits}{body}", setup.script),
    };
    let all = ["sh", "-c", script.as_str(), SCRIPT_NAME]
        .into_iter()
        .chain(words.iter().map(String::as_str));
    shlex::try_join(all).map(Some).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
