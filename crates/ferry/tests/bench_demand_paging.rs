//! `ferry bench demand-paging --quick --json` on small guests: every page of
//! every cell arrives through the fault path with the source's contents, on
//! kvm (userfaultfd variants) and soft (shared queue and vCPU-direct), and
//! the last stdout line is the results as JSON.

mod common;

use common::{assert_success, last_json, Ferry};

const KVM_PAGES: u64 = (4 << 20) / 4096;
const SOFT_PAGES_PER_VCPU: u64 = (2 << 20) / 4096;

#[test]
fn every_cell_pages_in_every_page_with_its_contents() {
    let out_dir = std::env::temp_dir().join(format!("ferry-bench-dp-{}", std::process::id()));
    let out = Ferry::new("bench demand-paging")
        .mem("4M")
        .args(&[
            "--quick",
            "--kvm-vcpus",
            "1",
            "--soft-vcpus",
            "1,2",
            "--soft-mem-per-vcpu",
            "2M",
            "--json",
            "--out",
            out_dir.to_str().expect("utf-8 temp dir"),
        ])
        .run();
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("shared queue"), "{stdout}");
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("demand-paging.json"))
            .expect("demand-paging.json written"),
    )
    .expect("JSON");
    let r = &written["results"];
    // --json: the last stdout line is the same results, with the outputs.
    let line = last_json(&out);
    assert_eq!(line["bench"], "demand-paging", "{line}");
    assert_eq!(&line["results"], r);

    let soft = r["soft"].as_array().expect("soft cells");
    assert_eq!(soft.len(), 4, "2 thread counts x 2 deliveries: {r}");
    for c in soft {
        let pages = c["vcpus"].as_u64().unwrap() * SOFT_PAGES_PER_VCPU;
        assert_eq!(c["pages"], pages, "{c}");
        assert_eq!(c["bad_pages"], 0, "{c}");
        assert!(
            c["exits"].as_u64().unwrap() >= pages,
            "a fault per page: {c}"
        );
    }

    if stdout.contains("SKIP: /dev/kvm") {
        ferry_vm::skip!("SKIP: /dev/kvm absent; kvm demand-paging cells not checked");
    } else {
        let kvm = r["kvm"].as_array().expect("kvm cells");
        assert!(kvm.len() >= 5, "the 4K cases at least: {r}");
        for c in kvm {
            assert_eq!(c["pages"], KVM_PAGES, "{c}");
            assert_eq!(c["bad_pages"], 0, "{c}");
            let case = &c["case"];
            let granule = if case["backing"] == "hugetlb" { 512 } else { 1 };
            let per_placement = case["prefetch"].as_u64().unwrap().max(granule);
            let placements = c["placements"].as_u64().unwrap();
            // Every page went through a placement; none placed twice.
            assert!(
                placements >= KVM_PAGES / per_placement && placements <= KVM_PAGES / granule,
                "{c}"
            );
            assert!(
                c["fault_events"].as_u64().unwrap() >= placements.min(1),
                "{c}"
            );
        }
        for s in r["kvm_skipped"].as_array().expect("skipped list") {
            ferry_vm::skip!("SKIP: {s}");
        }
    }
    assert!(out_dir.join("demand-paging.svg").exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}
