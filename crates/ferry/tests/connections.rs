//! Several data connections, with and without compression, between two ferry
//! processes over loopback, on both backends. Each migration must prove
//! itself as every other does (digest, stamps, the guest running on).

mod common;
use common::*;

fn migrate_over(backend: &str, compress: &str, fill: &str) -> serde_json::Value {
    let out = Ferry::demo()
        .on(backend)
        .guest("32M", 32)
        .args(&[
            "--connections",
            "4",
            "--compress",
            compress,
            "--fill",
            fill,
            "--warmup",
            "0.3",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    let context = format!("{backend} {compress} {fill}");
    assert_verified(&j, &context);
    assert_eq!(j["connections"], 4, "{context}: {j}");
    assert_eq!(j["wire_version"], 6, "{context}: {j}");
    assert_eq!(j["compression"], compress, "{context}: {j}");
    j
}

#[test]
fn four_connections_with_and_without_compression_on_both_backends() {
    for backend in backends("four connections") {
        let plain = migrate_over(backend, "none", "zero");
        let counts = &plain["batches_by_codec"];
        assert_eq!((counts[1].as_u64(), counts[2].as_u64()), (Some(0), Some(0)));
        for (i, codec) in [(1, "lz4"), (2, "zstd")] {
            let j = migrate_over(backend, codec, "text");
            let packed = j["batches_by_codec"][i].as_u64().unwrap();
            assert!(packed > 0, "{backend} {codec}: no batch compressed: {j}");
            let full = &j["round_stats"][0];
            assert!(
                full["bytes"].as_u64() < full["raw_bytes"].as_u64(),
                "{backend} {codec}: text did not shrink: {j}"
            );
        }
        // Random pages do not compress: they go raw, and still verify.
        let j = migrate_over(backend, "auto", "random");
        let counts = &j["batches_by_codec"];
        assert!(counts[0].as_u64().unwrap() > 0, "{backend}: {j}");
    }
}

#[test]
fn mutual_tls_on_both_backends() {
    for backend in backends("TLS") {
        let out = Ferry::demo()
            .on(backend)
            .guest("32M", 32)
            .args(&["--tls", "--connections", "2", "--warmup", "0.3"])
            .run();
        assert_no_panic(&out);
        let j = last_json(&out);
        assert_verified(&j, &format!("{backend} tls"));
        assert_eq!(j["tls"], true, "{backend}: {j}");
        assert_eq!(j["connections"], 2, "{backend}: {j}");
    }
}

#[test]
fn a_missing_tls_dir_is_refused_before_any_vm_boots() {
    let out = Ferry::new("migrate")
        .on("soft")
        .args(&[
            "--to",
            "127.0.0.1:9",
            "--tls-dir",
            "/nonexistent-ferry-tls-dir",
        ])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tls-dir: cannot read /nonexistent-ferry-tls-dir/ca.pem"),
        "{err}"
    );
    assert!(!err.contains("warming up"), "a VM booted: {err}");
}

#[test]
fn delta_resends_over_four_connections_on_both_backends() {
    for backend in backends("delta re-sends") {
        // A 1 ms downtime target, and no policy to hold the guest back,
        // keep precopy in dirty rounds until the round cap, so pages go
        // again and again.
        let out = Ferry::demo()
            .on(backend)
            .guest("16M", 64)
            .args(&[
                "--converge",
                "none",
                "--connections",
                "4",
                "--compress",
                "lz4",
                "--delta",
                "--fill",
                "text",
                "--downtime-ms",
                "1",
                "--max-rounds",
                "6",
                "--warmup",
                "0.3",
            ])
            .run();
        assert_no_panic(&out);
        let j = last_json(&out);
        assert_verified(&j, &format!("{backend} delta"));
        let pages = j["delta"]["pages"].as_u64().unwrap_or(0);
        assert!(pages > 0, "{backend}: no page went as a delta: {j}");
    }
}
