//! The suite's children: commands run to completion (their command line kept for the
//! report), servers kept up while a part measures them, and the CPU time they used.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to listen on its socket.
const SERVER_START_LIMIT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM before it is killed.
const SERVER_STOP_LIMIT: Duration = Duration::from_secs(30);
/// Lines of a failed child's standard error quoted in the error.
const ERROR_LINES: usize = 6;

/// A command line as a shell would take it (arguments quoted where needed).
pub fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|word| {
            if !word.is_empty()
                && word.chars().all(|character| character.is_ascii_alphanumeric() || "-_./:=,%+@".contains(character))
            {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A program and its arguments, kept as words so that the report can print them.
#[derive(Clone, Debug)]
pub struct Words(pub Vec<String>);

impl Words {
    pub fn new(program: impl AsRef<std::ffi::OsStr>) -> Words {
        Words(vec![program.as_ref().to_string_lossy().into_owned()])
    }

    pub fn arg(mut self, word: impl AsRef<std::ffi::OsStr>) -> Words {
        self.0.push(word.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(mut self, words: I) -> Words {
        for word in words {
            self = self.arg(word);
        }
        self
    }

    pub fn text(&self) -> String {
        shell_words(&self.0)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.0[0]);
        command.args(&self.0[1..]);
        command
    }
}

/// Run `words` to completion; its standard error goes to `log`. Returns its standard
/// output, or an error that names the command, its exit status and its last lines.
pub fn run(words: &Words, log: &Path) -> Result<String, String> {
    let stderr = std::fs::File::create(log).map_err(|error| format!("{}: {error}", log.display()))?;
    let output = words
        .command()
        .stdin(Stdio::null())
        .stderr(stderr)
        .output()
        .map_err(|error| format!("{}: {error}", words.0[0]))?;
    if !output.status.success() {
        return Err(format!(
            "`{}` failed ({}): {}",
            words.text(),
            output.status,
            last_lines(log, &String::from_utf8_lossy(&output.stdout))
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Run `words` and parse what it printed as JSON.
pub fn run_json(words: &Words, log: &Path) -> Result<serde_json::Value, String> {
    let output = run(words, log)?;
    parse_json(&output).map_err(|error| format!("`{}` printed no JSON report: {error}", words.text()))
}

/// The JSON object in `text` (fio may print notes before it).
pub fn parse_json(text: &str) -> Result<serde_json::Value, String> {
    let start = text.find('{').ok_or("no '{'")?;
    serde_json::from_str(&text[start..]).map_err(|error| error.to_string())
}

fn last_lines(log: &Path, stdout: &str) -> String {
    let stderr = std::fs::read_to_string(log).unwrap_or_default();
    let text = if stderr.trim().is_empty() { stdout.to_string() } else { stderr };
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(ERROR_LINES)..].join(" | ");
    if tail.is_empty() {
        format!("it printed nothing (log: {})", log.display())
    } else {
        format!("{tail} (log: {})", log.display())
    }
}

/// A server the suite started: stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Server {
    name: String,
    child: Option<Child>,
    pub socket: PathBuf,
}

impl Server {
    /// Start `words` with its standard error in `log` and wait until it listens on
    /// `socket`; fails loudly (with its log's last lines) when it exits or does not listen.
    pub fn start(name: &str, words: &Words, socket: &Path, log: &Path) -> Result<Server, String> {
        let _ = std::fs::remove_file(socket);
        let stderr = std::fs::File::create(log).map_err(|error| format!("{}: {error}", log.display()))?;
        let child = words
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|error| format!("{name}: cannot start `{}`: {error}", words.text()))?;
        let mut server = Server { name: name.into(), child: Some(child), socket: socket.to_path_buf() };
        let started = Instant::now();
        loop {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Ok(server);
            }
            if let Some(status) = server.child.as_mut().and_then(|child| child.try_wait().ok().flatten()) {
                server.child = None;
                return Err(format!(
                    "{name} exited ({status}) before it listened on {}: `{}`: {}",
                    socket.display(),
                    words.text(),
                    last_lines(log, "")
                ));
            }
            if started.elapsed() > SERVER_START_LIMIT {
                return Err(format!(
                    "{name} did not listen on {} within {} s: `{}`: {}",
                    socket.display(),
                    SERVER_START_LIMIT.as_secs(),
                    words.text(),
                    last_lines(log, "")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The NBD URI of the server's export (`export` may be empty: the default export).
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// Kill the server with SIGKILL (a crash) and wait for it: an error when it had
    /// already died.
    pub fn kill(mut self) -> Result<(), String> {
        let Some(mut child) = self.take_running()? else { return Ok(()) };
        child.kill().map_err(|error| format!("{}: {error}", self.name))?;
        child.wait().map_err(|error| format!("{}: {error}", self.name))?;
        Ok(())
    }

    /// Stop the server and report how it exited: an error when it had already died or did
    /// not exit cleanly on SIGTERM.
    pub fn stop(mut self) -> Result<(), String> {
        self.stop_inner()
    }

    /// The server's process, taken to be stopped (`None`: stopped already); an error when
    /// it had died while it was measured.
    fn take_running(&mut self) -> Result<Option<std::process::Child>, String> {
        let Some(mut child) = self.child.take() else { return Ok(None) };
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{} had exited ({status}) while it was measured", self.name));
        }
        Ok(Some(child))
    }

    fn stop_inner(&mut self) -> Result<(), String> {
        let Some(mut child) = self.take_running()? else { return Ok(()) };
        // SAFETY: kill(2) with the pid of a child this process started and has not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("{} exited with {status} on SIGTERM", self.name)),
                Ok(None) if started.elapsed() > SERVER_STOP_LIMIT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{} did not exit within {} s of SIGTERM",
                        self.name,
                        SERVER_STOP_LIMIT.as_secs()
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(error) => return Err(format!("{}: {error}", self.name)),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// The path of `program` on PATH, if any.
pub fn find_program(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|directory| directory.join(program)).find(|path| path.is_file())
    })
}

/// The first line a command prints (a version), or "unknown".
pub fn first_line_of(words: &[&str]) -> String {
    Command::new(words[0])
        .args(&words[1..])
        .output()
        .ok()
        .and_then(|output| String::from_utf8_lossy(&output.stdout).lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Now, in UTC, as 2026-11-28T15:04:05Z.
pub fn utc_now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let words: Vec<String> = ["fio", "--name=a b", "--rw=randwrite", "it's"].map(String::from).to_vec();
        assert_eq!(shell_words(&words), r"fio '--name=a b' --rw=randwrite 'it'\''s'");
    }

    #[test]
    fn a_server_that_exits_before_listening_is_an_error_naming_its_log() {
        let directory = std::env::temp_dir().join(format!("stripelog-suite-server-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let log = directory.join("server.log");
        let words = Words::new("sh").arg("-c").arg("echo 'no such volume' >&2; exit 3");
        let error = Server::start("the test server", &words, &directory.join("socket"), &log).err().unwrap();
        assert!(error.contains("exited") && error.contains("no such volume"), "{error}");
        std::fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn a_failed_command_is_an_error_with_its_last_lines() {
        let directory = std::env::temp_dir().join(format!("stripelog-suite-run-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let log = directory.join("run.log");
        let error = run(&Words::new("sh").arg("-c").arg("echo refused >&2; exit 1"), &log).err().unwrap();
        assert!(error.contains("refused") && error.contains("failed"), "{error}");
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
