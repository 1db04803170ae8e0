//! Init containers under the wrapper: the part of its script that runs them, in order,
//! before the command, once per container; the markers it prints for them; and how the
//! controller reads those back (whose lines are whose, how far they got).

use super::{Completion, is_marker_line, is_run_marker};
use crate::provider::InitProgress;

/// Running the init containers (see [`Inits`]): `runpod_kubelet_init NAME ENCODED` marks the
/// log as the init container's from here on, decodes its command line (env prefix and words,
/// shell-quoted, base64: never in the args RunPod shows), runs it as a child with signals
/// passed on, and prints its code; a failure is retried after 10 s where `init_retry` is `yes`
/// (restartPolicy OnFailure, Always), as the kubelet restarts a failed init container. Returns
/// non-zero for a failure that ends the pod (or a signal), its code in `$rc`.
const INIT: &str = r#"runpod_kubelet_init() {
  init_name=$1
  echo "runpod-kubelet: container=$init_name"
  if ! line=$(printf '%s' "$2" | base64 -d 2>/dev/null) || ! eval "set -- $line"; then
    echo "runpod-kubelet: could not read init container $init_name's command (the image needs base64)" >&2
    rc=126
    echo "runpod-kubelet: init-exit-code=$init_name=$rc"
    return 1
  fi
  while :; do
    runpod_kubelet_run "$@"
    echo "runpod-kubelet: init-exit-code=$init_name=$rc"
    [ -n "$signal" ] && return 1
    [ "$rc" -eq 0 ] && return 0
    [ "$init_retry" = yes ] || return 1
    runpod_kubelet_run sleep 10
    [ -n "$signal" ] && return 1
    echo "runpod-kubelet: container=$init_name"
  done
}
"#;

/// What the wrapper prints when the log's lines become a container's (an init container's, or
/// the main container's once its init containers are done), before the container's name.
pub(crate) const CONTAINER_PREFIX: &str = "runpod-kubelet: container=";

/// What the wrapper prints when an init container's run ended: `NAME=CODE`.
pub(crate) const INIT_EXIT_PREFIX: &str = "runpod-kubelet: init-exit-code=";

/// What the wrapper prints once the init containers are done: the lines after it are the
/// main container's.
pub(crate) const INITIALIZED: &str = "runpod-kubelet: initialized";

/// Prefix of the env vars that carry the init containers' command lines, one per init
/// container in order.
const INIT_ENV_PREFIX: &str = "RUNPOD_KUBELET_INIT_";

/// The pod's init containers as the wrapper runs them, in order, in the one container before
/// its command: each one's name and its command line (an `env` prefix that gives it its own
/// environment, then its words), carried in env. [`INITIALIZED`] marks where the container's
/// own log starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inits {
    names: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
}

impl Inits {
    /// The init containers of a pod whose main container has `main_env` (the container's
    /// process environment): each one's command line gives it its own environment (`env -u`
    /// for the main container's variables it lacks, then its own), as a container of its own
    /// would have; `None` when there are none.
    pub(crate) fn of(
        inits: &[(
            &k8s_openapi::api::core::v1::Container,
            std::collections::BTreeMap<String, String>,
        )],
        main_env: &std::collections::BTreeMap<String, String>,
    ) -> Result<Option<Inits>, String> {
        let mut steps = Vec::new();
        for (init, env) in inits {
            let words = runpod_contract::env::command_words(init, env);
            if words.is_empty() {
                return Err(format!("init container {:?} sets no command", init.name));
            }
            // Not the others' command lines either.
            let mut line = vec!["env".to_owned()];
            for index in 0..inits.len() {
                line.extend(["-u".to_owned(), format!("{INIT_ENV_PREFIX}{index}")]);
            }
            for name in main_env.keys().filter(|name| !env.contains_key(*name)) {
                line.extend(["-u".to_owned(), name.clone()]);
            }
            line.extend(env.iter().map(|(name, value)| format!("{name}={value}")));
            line.extend(words);
            steps.push((init.name.clone(), line));
        }
        Inits::new(&steps)
    }

    /// `steps`: (name, command line words) in order; `None` when there are none.
    pub(crate) fn new(steps: &[(String, Vec<String>)]) -> Result<Option<Inits>, String> {
        use base64::Engine as _;
        if steps.is_empty() {
            return Ok(None);
        }
        let mut env = std::collections::BTreeMap::new();
        let mut names = Vec::new();
        for (index, (name, words)) in steps.iter().enumerate() {
            let line = shlex::try_join(words.iter().map(String::as_str))
                .map_err(|e| format!("init container {name:?}: {e}"))?;
            env.insert(
                format!("{INIT_ENV_PREFIX}{index}"),
                base64::engine::general_purpose::STANDARD.encode(line),
            );
            names.push(name.clone());
        }
        Ok(Some(Inits { names, env }))
    }

    /// The script's part that runs them once per container (a container RunPod restarts does
    /// not run them again, as a restarted container on a node does not), then marks the main
    /// container's log.
    pub(super) fn script(
        &self,
        completion: Completion,
        init_marker: &str,
    ) -> Result<String, String> {
        let quote = |text: &str| {
            shlex::try_quote(text)
                .map(|q| q.into_owned())
                .map_err(|e| format!("{text:?}: {e}"))
        };
        let failed = match completion {
            Completion::Forever => "exit \"$rc\"",
            Completion::RunOnce | Completion::UntilSuccess => "runpod_kubelet_finish \"$rc\"",
        };
        let retry = if completion == Completion::RunOnce {
            "no"
        } else {
            "yes"
        };
        let marker = quote(init_marker)?;
        // Files that could not be written: no init container runs, the command's `exit 126`
        // (set by the setup) ends the run.
        let mut script = format!(
            "init_retry={retry}\n{INIT}if [ -z \"$runpod_kubelet_setup_failed\" ] && [ ! -f {marker} ]; then\n"
        );
        for (index, name) in self.names.iter().enumerate() {
            script.push_str(&format!(
                "  runpod_kubelet_init {} \"${INIT_ENV_PREFIX}{index}\" || {failed}\n",
                quote(name)?
            ));
        }
        // `printf`, not `:`: a redirection that fails on a special built-in ends the shell.
        script.push_str(&format!(
            "  [ -z \"$signal\" ] || {failed}\n  printf '' >{marker} 2>/dev/null\nfi\nunset"
        ));
        for index in 0..self.names.len() {
            script.push_str(&format!(" {INIT_ENV_PREFIX}{index}"));
        }
        script.push_str(&format!("\necho '{INITIALIZED}'\n"));
        Ok(script)
    }
}

/// Which container's log a line of the pod's log is, read in order: the main container's
/// until the wrapper says an init container runs, and again once it says they are done. Only
/// for a pod that has init containers (`split`): in any other a line that looks like the
/// wrapper's is the container's own output.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogOwner {
    /// The init container whose lines these are (`None`: the main container's).
    current: Option<String>,
    split: bool,
}

impl LogOwner {
    /// For a log of a pod with init containers (`split`).
    pub(crate) fn new(split: bool) -> LogOwner {
        LogOwner {
            current: None,
            split,
        }
    }

    /// For a window of the log (a tail) that may start in an init container's lines: they
    /// are that container's when the first marker in `lines` is its exit.
    pub(crate) fn for_window<'a>(lines: impl IntoIterator<Item = &'a str>) -> LogOwner {
        let mut split = false;
        let mut current = None;
        for line in lines {
            let line = line.trim();
            if let Some((name, _)) = line
                .strip_prefix(INIT_EXIT_PREFIX)
                .and_then(|rest| rest.rsplit_once('='))
            {
                if !split {
                    current = Some(name.to_owned());
                }
                split = true;
                break;
            }
            if line.starts_with(CONTAINER_PREFIX) || line == INITIALIZED {
                split = true;
                break;
            }
        }
        LogOwner { current, split }
    }

    /// Reads `line`: `None` for a marker, else whose line it is (an init container's name;
    /// `None`: the main container's).
    pub(crate) fn read(&mut self, line: &str) -> Option<Option<&str>> {
        if !self.split {
            return (!is_run_marker(line)).then_some(None);
        }
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix(CONTAINER_PREFIX) {
            self.current = Some(name.to_owned());
        } else if trimmed == INITIALIZED {
            self.current = None;
        }
        (!is_marker_line(line)).then_some(self.current.as_deref())
    }

    /// Reads `line`: whether it is a line of `wanted` (an init container's name; `None`: the
    /// main container), never a marker.
    pub(crate) fn keeps(&mut self, line: &str, wanted: Option<&str>) -> bool {
        self.read(line) == Some(wanted)
    }
}

/// How far the init containers got, from the wrapper's lines in order.
pub(crate) fn init_progress<'a>(lines: impl IntoIterator<Item = &'a str>) -> InitProgress {
    let mut progress = InitProgress::default();
    // The last marker said an init container failed (an exit code right after it is that
    // failure's, not the command's).
    let mut failed_last = false;
    for line in lines {
        let line = line.trim();
        if line == INITIALIZED {
            progress.initialized = true;
            for run in &mut progress.runs {
                run.running = false;
            }
        } else if let Some(name) = line.strip_prefix(CONTAINER_PREFIX) {
            let run = progress.run(name);
            run.starts += 1;
            run.running = true;
        } else if let Some((name, code)) = line
            .strip_prefix(INIT_EXIT_PREFIX)
            .and_then(|rest| rest.rsplit_once('='))
        {
            let run = progress.run(name);
            // An unreadable code is no success.
            let code = code.trim().parse().unwrap_or(1);
            run.last_code = Some(code);
            run.running = false;
            failed_last = code != 0;
            continue;
        } else if line.starts_with(crate::provider::EXIT_CODE_PREFIX)
            && !failed_last
            && !progress.runs.is_empty()
        {
            // The command's code, not an init container's failure: they were done (a tail
            // may have lost the line that said so).
            progress.initialized = true;
        }
        if is_marker_line(line) {
            failed_last = false;
        }
    }
    progress
}
