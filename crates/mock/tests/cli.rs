//! The `tailguard-mock` binary: bounded runs that stop by themselves.

use std::process::Command;

#[test]
fn bench_runs_load_against_a_replica_and_writes_json() {
    let dir = std::env::temp_dir().join(format!("tailguard-mock-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard-mock"))
        .args([
            "bench",
            "--script",
            "ttft=1ms,tokens=3",
            "--rate",
            "100",
            "--duration",
            "200ms",
            "--max-requests",
            "40",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("p99.9"), "{stdout}");
    assert!(stdout.contains("replica 0: requests="), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let scheduled = v["scheduled"].as_u64().unwrap();
    assert!(scheduled > 0);
    assert_eq!(v["end_reasons"]["completed"].as_u64(), Some(scheduled));
    assert_eq!(v["tokens"].as_u64(), Some(3 * scheduled));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn serve_prints_replicas_and_stops() {
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard-mock"))
        .args([
            "serve",
            "--replicas",
            "2",
            "--script",
            "ttft=5ms",
            "--replica-script",
            "1=stall_after=2",
            "--for",
            "100ms",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("replica 0: http://127.0.0.1:"), "{stdout}");
    assert!(stdout.contains("replica 1: http://127.0.0.1:"), "{stdout}");
    assert!(
        stdout.contains("stall_after=2,stall_for=forever"),
        "{stdout}"
    );
}

#[test]
fn bad_scripts_are_reported_not_panics() {
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard-mock"))
        .args(["serve", "--script", "ttft=never", "--for", "10ms"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid mock script"));
}

#[test]
fn serve_takes_the_replica_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard-mock"))
        .args([
            "serve",
            "--script",
            "single_slot=true,garbage=not_json",
            "--head-after-slot",
            "--interrupt",
            "--keep-alive-timeout",
            "5s",
            "--prefill-cancelled",
            "--for",
            "50ms",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains(
            "options: head_after_slot=true,interrupt=true,keep_alive_timeout=5s,prefill_cancelled=true"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("garbage=not_json"), "{stdout}");
    assert!(
        stdout.contains("interrupted=0 truncated=0 served_late=0"),
        "{stdout}"
    );
}
