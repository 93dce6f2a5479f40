//! The log lines of the engine, the NBD server and the CLI: one structured line each on
//! standard error, `time=... level=... source=... message="..."` (logfmt), at the level
//! `--log-level` chooses. Per-connection lines are at `debug`: quiet by default.

use std::io::Write;

/// Log levels `--log-level` takes, quietest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
        }
    }
}

struct LineLogger;

/// 9999-12-31T23:59:59Z, the last time RFC 3339 (and humantime) can write.
const LAST_SECOND_OF_9999: u64 = 253_402_300_799;

/// `source`: the module path without the crate prefixes, e.g. `serve`, `nbd::server`.
fn source(target: &str) -> &str {
    let target = target.strip_prefix("stripelog_").unwrap_or(target);
    target.strip_prefix("stripelog::").unwrap_or(target)
}

/// The logfmt line of one record.
fn line(time: std::time::SystemTime, level: log::Level, target: &str, message: &str) -> String {
    let escaped = message.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n").replace('\r', "\\r");
    // humantime panics outside years 1970 to 9999: a clock that wrong gets seconds.
    let seconds = time.duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_secs());
    let stamp = match seconds {
        Ok(seconds) if seconds < LAST_SECOND_OF_9999 => humantime::format_rfc3339_millis(time).to_string(),
        Ok(seconds) => format!("unix:{seconds}"),
        Err(_) => "before-1970".to_string(),
    };
    format!(
        "time={stamp} level={} source={} message=\"{escaped}\"",
        level.as_str().to_ascii_lowercase(),
        source(target)
    )
}

impl log::Log for LineLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let text = line(std::time::SystemTime::now(), record.level(), record.target(), &record.args().to_string());
        // One write per line: lines of different threads do not interleave.
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }

    fn flush(&self) {}
}

static LOGGER: LineLogger = LineLogger;

/// Send every log record at `level` or above to standard error, one line each.
pub(crate) fn init(level: LogLevel) {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level.filter());
    }
    // A panic is a bug: its message, where it happened and the backtrace go to the log at
    // error level (one line each, whatever RUST_BACKTRACE says), whoever catches it after
    // (the engine stops the volume, the server stops serving).
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|message| message.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        let place = info.location().map(|location| location.to_string()).unwrap_or_default();
        let backtrace = std::backtrace::Backtrace::force_capture();
        log::error!(
            "panic: thread {} panicked at {place}: {message}; backtrace:\n{backtrace}",
            thread.name().unwrap_or("unnamed")
        );
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_one_logfmt_line_with_time_level_source_and_quoted_message() {
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_764_000_000_123);
        let text = line(time, log::Level::Warn, "stripelog_nbd::server", "export 'a' said \"no\"\nthen");
        assert_eq!(
            text,
            "time=2025-11-24T16:00:00.123Z level=warn source=nbd::server message=\"export 'a' said \\\"no\\\"\\nthen\""
        );
        assert_eq!(source("stripelog::serve"), "serve");
        // A clock beyond what RFC 3339 writes: no panic in the logger.
        let far = std::time::UNIX_EPOCH + std::time::Duration::from_secs(LAST_SECOND_OF_9999 + 10);
        assert!(line(far, log::Level::Info, "x", "m").starts_with("time=unix:253402300809 "));
        let early = std::time::UNIX_EPOCH - std::time::Duration::from_secs(1);
        assert!(line(early, log::Level::Info, "x", "a\rb").starts_with("time=before-1970 "));
        assert!(line(early, log::Level::Info, "x", "a\rb").ends_with("message=\"a\\rb\""));
    }
}
