//! Structured logging set-up.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

pub(crate) fn init(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    }
    .map_err(|error| anyhow::anyhow!("logging: {error}"))
}
