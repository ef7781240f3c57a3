//! The processes the bench runs: the mock replicas, the gateway and nginx, each in a
//! process group of its own that is killed when its guard drops.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tailguard::core::BoxError;
use tokio::time::Instant;

/// Every child runs under `timeout`, so that one the bench could not kill (the bench itself
/// killed with SIGKILL) still ends: an hour, far longer than a run.
const BACKSTOP: &str = "3600s";
/// How long a child may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running child process (and its process group), killed on drop.
pub(crate) struct Proc {
    name: &'static str,
    child: Child,
    /// Where its stdout and stderr go.
    log: PathBuf,
}

impl Proc {
    /// Starts `program args` in a process group of its own, stdout and stderr to `log`.
    fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Proc, BoxError> {
        let out = std::fs::File::create(&log)?;
        let child = Command::new("timeout")
            .args(["-k", "5s", BACKSTOP])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {name} ({}): {e}", program.display()))?;
        Ok(Proc { name, child, log })
    }

    /// CPU time used so far by every process of the child's group (the `timeout` wrapper and
    /// the program under it, threads included), in clock ticks; children that ended count
    /// only through the group members that waited for them.
    pub(crate) fn cpu_ticks(&self) -> Result<u64, BoxError> {
        let pgid = self.child.id().to_string();
        let mut ticks = 0;
        for entry in std::fs::read_dir("/proc")? {
            let path = entry?.path().join("stat");
            let Ok(stat) = std::fs::read_to_string(&path) else {
                continue; // Not a process, or one that just ended.
            };
            // After the command name (in parentheses, which may hold spaces): state, ppid,
            // pgrp, ..., utime (14th field of the line) and stime (15th).
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() > 12 && f[2] == pgid {
                ticks += f[11].parse::<u64>()? + f[12].parse::<u64>()?;
            }
        }
        Ok(ticks)
    }

    /// The child's output so far.
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails if the child has exited.
    fn check_alive(&mut self) -> Result<(), BoxError> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(format!(
                "{} exited ({status}); its output:\n{}",
                self.name,
                self.output()
            )
            .into()),
        }
    }

    /// Waits until the child's output has `n` lines containing `marker`; returns them.
    fn wait_for_lines(&mut self, marker: &str, n: usize) -> Result<Vec<String>, BoxError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let lines: Vec<String> = self
                .output()
                .lines()
                .filter(|l| l.contains(marker))
                .map(str::to_owned)
                .collect();
            if lines.len() >= n {
                return Ok(lines);
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not start; its output:\n{}",
                    self.name,
                    self.output()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn signal_group(pgid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stderr(Stdio::null())
        .status();
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pgid = self.child.id();
        signal_group(pgid, "TERM");
        for _ in 0..40 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Whatever is left of the group (nginx's workers included).
        signal_group(pgid, "KILL");
        let _ = self.child.wait();
    }
}

/// The first `http://…` word of `line`.
fn url_in(line: &str) -> Result<String, BoxError> {
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(str::to_owned)
        .ok_or_else(|| format!("no URL in `{line}`").into())
}

/// `tailguard-mock serve`: `replicas` replicas on free ports; returns it and their URLs.
pub(crate) fn start_mock(
    bin: &Path,
    dir: &Path,
    replicas: usize,
    script: &str,
) -> Result<(Proc, Vec<String>), BoxError> {
    let args = [
        "serve",
        "--replicas",
        &replicas.to_string(),
        "--port",
        "0",
        "--script",
        script,
        "--for",
        BACKSTOP,
    ]
    .map(str::to_owned);
    let mut p = Proc::spawn("tailguard-mock", bin, &args, dir.join("mock.log"))?;
    let lines = p.wait_for_lines("script:", replicas)?;
    let urls = lines.iter().map(|l| url_in(l)).collect::<Result<_, _>>()?;
    Ok((p, urls))
}

/// The gateway over `upstreams` as a new user starts it: every setting its default (issue 29:
/// the defaults must refuse nothing a plain proxy serves, and this bench checks that against
/// nginx); returns it and its URL.
pub(crate) fn start_gateway(
    bin: &Path,
    dir: &Path,
    upstreams: &[String],
) -> Result<(Proc, String), BoxError> {
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0"].map(str::to_owned).into();
    for u in upstreams {
        args.extend(["--upstream".to_owned(), u.clone()]);
    }
    let mut p = Proc::spawn("gateway", bin, &args, dir.join("gateway.log"))?;
    let line = p.wait_for_lines("listening on", 1)?;
    let url = url_in(&line[0])?;
    Ok((p, url))
}

/// The layer-less hyper proxy ([`crate::bare_proxy`]): this program again, with
/// `--bare-proxy` and the replicas' URLs.
/// With `read_tokens`, it also reads each stream once, as a token-aware front must.
pub(crate) fn start_bare_proxy(
    dir: &Path,
    upstreams: &[String],
    read_tokens: bool,
) -> Result<(Proc, String), BoxError> {
    let mut args = vec!["--bare-proxy".to_owned()];
    let (name, log) = if read_tokens {
        args.push("--read-tokens".to_owned());
        ("reading proxy", "reading_proxy.log")
    } else {
        ("bare proxy", "bare_proxy.log")
    };
    args.extend(upstreams.iter().cloned());
    let exe = std::env::current_exe()?;
    let mut p = Proc::spawn(name, &exe, &args, dir.join(log))?;
    let line = p.wait_for_lines("listening on", 1)?;
    let url = url_in(&line[0])?;
    Ok((p, url))
}

/// An nginx configuration as a new user would write it for streamed completions: 2 workers,
/// `proxy_buffering off`, HTTP/1.1 keep-alive connections to the upstreams, access log on.
fn nginx_conf(dir: &Path, port: u16, upstreams: &[String]) -> String {
    let servers: String = upstreams
        .iter()
        .map(|u| format!("    server {};\n", u.trim_start_matches("http://")))
        .collect();
    let d = dir.display();
    format!(
        "daemon off;
worker_processes 2;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log {d}/nginx-access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  upstream replicas {{
{servers}    keepalive 512;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"
    )
}

/// nginx in front of `upstreams`; returns it and its URL.
pub(crate) fn start_nginx(
    bin: &Path,
    dir: &Path,
    upstreams: &[String],
) -> Result<(Proc, String), BoxError> {
    // A free port (nginx cannot report the one it picked).
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir, port, upstreams))?;
    let args = [
        "-p".to_owned(),
        dir.display().to_string(),
        "-e".to_owned(),
        dir.join("nginx-error.log").display().to_string(),
        "-c".to_owned(),
        conf.display().to_string(),
    ];
    let mut p = Proc::spawn("nginx", bin, &args, dir.join("nginx.log"))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + START_TIMEOUT;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        p.check_alive()?;
        if Instant::now() > deadline {
            return Err("nginx did not start listening".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((p, format!("http://{addr}")))
}

/// The workspace root (this package's parent).
fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Builds `tailguard-mock` and the gateway (release), next to this program; returns
/// their paths.
pub(crate) fn build_binaries() -> Result<(PathBuf, PathBuf), BoxError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building tailguard-mock and the gateway (release)...");
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args([
            "build",
            "--release",
            "-p",
            "tailguard-mock",
            "--bin",
            "tailguard-mock",
        ])
        .args(["-p", "tailguard-gateway", "--bin", "tailguard-gateway"])
        .status()?;
    if !status.success() {
        return Err("cargo build of tailguard-mock and the gateway failed".into());
    }
    // This program is <target>/release/gateway_nginx.
    let exe = std::env::current_exe()?;
    let release = exe.parent().ok_or("no directory for this program")?;
    Ok((
        release.join("tailguard-mock"),
        release.join("tailguard-gateway"),
    ))
}

/// The nginx binary: installed by `scripts/install-nginx.sh` when missing; `None` (with the
/// reason printed) where it cannot be had.
pub(crate) fn nginx_binary() -> Option<PathBuf> {
    let out = Command::new(workspace().join("scripts/install-nginx.sh"))
        .stderr(Stdio::inherit())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let path = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            Some(PathBuf::from(path))
        }
        Ok(_) => {
            eprintln!("nginx cannot be had here (see above): the nginx column is skipped");
            None
        }
        Err(e) => {
            eprintln!("scripts/install-nginx.sh could not run ({e}): the nginx column is skipped");
            None
        }
    }
}
