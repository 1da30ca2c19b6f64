//! The KubeVirt export of a plan: every object valid by KubeVirt's own
//! OpenAPI schema (`tests/fixtures/kubevirt-swagger.json`, v1.6.0), each VM
//! pinned to its planned host under a policy that selects it, waves that
//! keep to the plan, and a plan that cannot be met refused naming the VM.
//!
//! The schema is checked by a small Swagger 2.0 validator written here
//! (`Schema`): `type` (one or several), `properties`, `required`, `$ref`
//! into `#/definitions`, `items`, `additionalProperties` and `enum`. A
//! property the schema does not list, where it lists properties and allows
//! no others, is an error, as it is to the API server's strict field
//! validation (kubectl's default). `the_validator_refuses_what_the_api_would`
//! shows that it fails wrong objects, so the test can fail.

use ferry_engine::choices::ConvergeMode;
use ferry_fleet::export::{
    self, ExportError, KubeVirtOptions, BEFORE_WAVE_LABEL, DOWNTIME_TARGET_ANNOTATION,
    HOSTNAME_LABEL, LABEL_VMIS_ANNOTATION, PLANNED_START_ANNOTATION, POLICY_LABEL, WAVE_LABEL,
};
use ferry_fleet::{generate, run, Admission, DrainOutcome, Fleet};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::OnceLock;

mod common;
use common::*;

fn opts() -> KubeVirtOptions {
    KubeVirtOptions {
        namespace: Some("vms".into()),
    }
}

/// KubeVirt's schema, read once.
fn swagger() -> &'static Value {
    static S: OnceLock<Value> = OnceLock::new();
    S.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/kubevirt-swagger.json"
        );
        let text = std::fs::read_to_string(path).expect("the fixture");
        serde_json::from_str(&text).expect("the fixture is JSON")
    })
}

/// A Swagger 2.0 schema's `definitions`, and a validator over them.
struct Schema<'a> {
    definitions: &'a serde_json::Map<String, Value>,
}

impl<'a> Schema<'a> {
    fn kubevirt() -> Self {
        Schema {
            definitions: swagger()["definitions"]
                .as_object()
                .expect("a definitions object"),
        }
    }

    /// Every way `value` breaks definition `name`, each with its path.
    fn errors(&self, name: &str, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        let schema = self
            .definitions
            .get(name)
            .unwrap_or_else(|| panic!("no definition {name}"));
        self.check(schema, value, "$", &mut errors);
        errors
    }

    fn check(&self, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let name = r
                .strip_prefix("#/definitions/")
                .unwrap_or_else(|| panic!("{at}: a $ref outside #/definitions: {r}"));
            let target = self
                .definitions
                .get(name)
                .unwrap_or_else(|| panic!("{at}: $ref to a missing definition {name}"));
            return self.check(target, value, at, errors);
        }
        if let Some(t) = schema.get("type") {
            let types: Vec<&str> = match t {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                other => panic!("{at}: a type that is neither a name nor a list: {other}"),
            };
            if !types.iter().any(|t| is_type(value, t)) {
                errors.push(format!(
                    "{at}: {value} is not of type {}",
                    types.join(" or ")
                ));
                return;
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
            if !allowed.contains(value) {
                errors.push(format!("{at}: {value} is not one of {allowed:?}"));
            }
        }
        if let Some(items) = value.as_array() {
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    self.check(item, v, &format!("{at}[{i}]"), errors);
                }
            }
        }
        let Some(object) = value.as_object() else {
            return;
        };
        let properties = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties");
        for required in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !object.contains_key(required) {
                errors.push(format!("{at}: the required {required} is missing"));
            }
        }
        for (key, v) in object {
            let here = format!("{at}.{key}");
            match (properties.and_then(|p| p.get(key)), additional) {
                (Some(s), _) => self.check(s, v, &here, errors),
                (None, Some(Value::Bool(true))) => {}
                (None, Some(Value::Bool(false))) => {
                    errors.push(format!("{here}: no such field"));
                }
                (None, Some(s)) => self.check(s, v, &here, errors),
                // Listed properties and nothing else: strict.
                (None, None) if properties.is_some() => {
                    errors.push(format!("{here}: no such field"));
                }
                // A free-form object.
                (None, None) => {}
            }
        }
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "null" => v.is_null(),
        other => panic!("a type this validator does not know: {other}"),
    }
}

/// The definition an object of the export is checked against.
fn definition_of(object: &Value) -> &'static str {
    match (object["apiVersion"].as_str(), object["kind"].as_str()) {
        (Some("kubevirt.io/v1"), Some("VirtualMachineInstanceMigration")) => {
            "v1.VirtualMachineInstanceMigration"
        }
        (Some("migrations.kubevirt.io/v1alpha1"), Some("MigrationPolicy")) => {
            "v1alpha1.MigrationPolicy"
        }
        other => panic!("an object of no kind the export makes: {other:?}"),
    }
}

/// The planner's plan of `fleet` and its export, as JSON.
fn planned(fleet: &Fleet) -> (DrainOutcome, Value) {
    let (outcome, export) = export::plan_kubevirt(fleet, 1, &opts()).unwrap();
    let list = serde_json::to_value(export.to_list()).unwrap();
    (outcome, list)
}

fn items(list: &Value) -> &Vec<Value> {
    list["items"].as_array().expect("a List has items")
}

fn migrations(list: &Value) -> Vec<&Value> {
    items(list)
        .iter()
        .filter(|o| o["kind"] == "VirtualMachineInstanceMigration")
        .collect()
}

fn label<'v>(o: &'v Value, key: &str) -> Option<&'v str> {
    o["metadata"]["labels"][key].as_str()
}

fn annotation(o: &Value, key: &str) -> f64 {
    o["metadata"]["annotations"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} on {o}"))
        .parse()
        .unwrap()
}

#[test]
fn every_object_is_valid_kubevirt_by_its_schema() {
    let schema = Schema::kubevirt();
    for fleet in [two_racks(), generate::fat_tree(64, 2)] {
        let (outcome, list) = planned(&fleet);
        assert_eq!(list["apiVersion"], "v1");
        assert_eq!(list["kind"], "List");
        assert_eq!(migrations(&list).len(), outcome.vms.len());
        for object in items(&list) {
            let errors = schema.errors(definition_of(object), object);
            assert!(errors.is_empty(), "{errors:#?}\nin {object:#}");
        }
    }
}

#[test]
fn the_validator_refuses_what_the_api_would() {
    let schema = Schema::kubevirt();
    let (_, list) = planned(&two_racks());
    let migration = migrations(&list)[0].clone();
    let policy = items(&list)[0].clone();
    assert_eq!(policy["kind"], "MigrationPolicy");
    // An object, a piece of the error its change must give, the change.
    type Case = (Value, &'static str, Box<dyn Fn(&mut Value)>);
    let cases: Vec<Case> = vec![
        (
            migration.clone(),
            "$.spec.addedNodeSelector: 5 is not of type object",
            Box::new(|o| o["spec"]["addedNodeSelector"] = 5.into()),
        ),
        (
            migration.clone(),
            "$.spec.addedNodeSelector.kubernetes.io/hostname: 3 is not of type string",
            Box::new(|o| o["spec"]["addedNodeSelector"][HOSTNAME_LABEL] = 3.into()),
        ),
        (
            migration.clone(),
            "$.spec.vmiNmae: no such field",
            Box::new(|o| {
                let name = o["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("vmiName")
                    .unwrap();
                o["spec"]["vmiNmae"] = name;
            }),
        ),
        (
            migration.clone(),
            "$.spec.priority: no such field",
            // v1.7 added it, and only virt-controller may set it.
            Box::new(|o| o["spec"]["priority"] = "user-triggered".into()),
        ),
        (
            migration.clone(),
            "$.metadata.labels.ferry.dev/wave: 1 is not of type string",
            Box::new(|o| o["metadata"]["labels"][WAVE_LABEL] = 1.into()),
        ),
        (
            migration.clone(),
            "the required spec is missing",
            Box::new(|o| {
                o.as_object_mut().unwrap().remove("spec");
            }),
        ),
        (
            policy.clone(),
            "$.spec.completionTimeoutPerGiB: \"30\" is not of type integer",
            Box::new(|o| o["spec"]["completionTimeoutPerGiB"] = "30".into()),
        ),
        (
            policy.clone(),
            "$.spec.completionTimeoutPerGib: no such field",
            Box::new(|o| {
                let t = o["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("completionTimeoutPerGiB")
                    .unwrap();
                o["spec"]["completionTimeoutPerGib"] = t;
            }),
        ),
        (
            policy.clone(),
            "$.spec.bandwidthPerMigration: true is not of type string or integer or number",
            Box::new(|o| o["spec"]["bandwidthPerMigration"] = true.into()),
        ),
        (
            policy.clone(),
            "$.spec: the required selectors is missing",
            Box::new(|o| {
                o["spec"].as_object_mut().unwrap().remove("selectors");
            }),
        ),
        (
            policy.clone(),
            "$.spec.maxDowntimeMs: no such field",
            // v1.9 added it, behind a feature gate.
            Box::new(|o| o["spec"]["maxDowntimeMs"] = 300.into()),
        ),
    ];
    for (original, want, change) in cases {
        assert!(schema
            .errors(definition_of(&original), &original)
            .is_empty());
        let mut wrong = original.clone();
        change(&mut wrong);
        let errors = schema.errors(definition_of(&wrong), &wrong);
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "want {want:?}, got {errors:#?}"
        );
    }
}

#[test]
fn each_vm_moves_to_its_planned_host_under_a_policy_that_selects_it() {
    let fleet = two_racks();
    let (outcome, list) = planned(&fleet);
    let policies: BTreeMap<&str, &Value> = items(&list)
        .iter()
        .filter(|o| o["kind"] == "MigrationPolicy")
        .map(|p| (p["metadata"]["name"].as_str().unwrap(), p))
        .collect();
    assert!(!policies.is_empty());
    let mut labelled: Vec<String> = Vec::new();
    for p in policies.values() {
        assert_eq!(label(p, WAVE_LABEL), Some("0"), "{p}");
        assert!(
            p["metadata"].get("namespace").is_none(),
            "cluster-wide: {p}"
        );
        assert_eq!(p["spec"]["allowPostCopy"], false);
        let timeout = p["spec"]["completionTimeoutPerGiB"].as_i64().unwrap();
        assert!((10..=150).contains(&timeout), "{p}");
        // The kubectl line labels VMIs with what the policy selects.
        let selector = p["spec"]["selectors"]["virtualMachineInstanceSelector"]
            .as_object()
            .unwrap();
        assert_eq!(selector.len(), 1);
        let command = p["metadata"]["annotations"][LABEL_VMIS_ANNOTATION]
            .as_str()
            .unwrap();
        let words: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(
            words[..6],
            ["kubectl", "label", "vmi", "--overwrite", "-n", "vms"]
        );
        let want = format!(
            "{POLICY_LABEL}={}",
            selector[POLICY_LABEL].as_str().unwrap()
        );
        assert_eq!(words.last(), Some(&want.as_str()));
        labelled.extend(words[6..words.len() - 1].iter().map(|s| s.to_string()));
    }
    labelled.sort();
    let mut all: Vec<String> = outcome.vms.iter().map(|o| o.vm.clone()).collect();
    all.sort();
    assert_eq!(labelled, all, "each VMI is labelled once");

    for o in &outcome.vms {
        let m: Vec<&Value> = migrations(&list)
            .into_iter()
            .filter(|m| m["spec"]["vmiName"] == o.vm.as_str())
            .collect();
        assert_eq!(m.len(), 1, "one migration for {}", o.vm);
        let m = m[0];
        assert_eq!(m["metadata"]["namespace"], "vms");
        assert_eq!(m["metadata"]["name"], format!("ferry-{}", o.vm));
        assert_eq!(
            m["spec"]["addedNodeSelector"],
            serde_json::json!({HOSTNAME_LABEL: o.to})
        );
        assert_eq!(annotation(m, DOWNTIME_TARGET_ANNOTATION), 300.0);
        // Its policy: the planner's cap (a 1 GB/s NIC: 953 MiB/s), and
        // auto-converge unless ferry runs it unthrottled.
        let p = policies[label(m, POLICY_LABEL).unwrap()];
        assert_eq!(p["spec"]["bandwidthPerMigration"], "953Mi", "{p}");
        assert_eq!(
            p["spec"]["allowAutoConverge"],
            o.policy != ConvergeMode::None,
            "{p}"
        );
        let converge = p["metadata"]["annotations"]["ferry.dev/convergence"]
            .as_str()
            .unwrap();
        assert!(
            converge.split(", ").any(|c| c == o.policy.to_string()),
            "{p}"
        );
    }
}

#[test]
fn waves_keep_to_the_plan() {
    for fleet in [two_racks(), generate::fat_tree(64, 2)] {
        let (outcome, list) = planned(&fleet);
        // Policies first, then the waves in order.
        let waves: Vec<usize> = items(&list)
            .iter()
            .map(|o| label(o, WAVE_LABEL).unwrap().parse().unwrap())
            .collect();
        assert!(waves.windows(2).all(|w| w[0] <= w[1]), "{waves:?}");
        assert_eq!(waves[0], 0);
        let ms = migrations(&list);
        let last = *waves.last().unwrap();
        let wave = |m: &Value| -> usize { label(m, WAVE_LABEL).unwrap().parse().unwrap() };
        let start = |m: &Value| annotation(m, PLANNED_START_ANNOTATION);
        let of = |m: &Value| {
            outcome
                .vms
                .iter()
                .find(|o| m["spec"]["vmiName"] == o.vm.as_str())
                .unwrap()
        };
        // A wave: the migrations the plan starts together.
        let mut t = vec![f64::NAN; last + 1];
        for m in &ms {
            let o = of(m);
            assert!((start(m) - o.start_s).abs() < 1e-3, "{m}");
            let w = wave(m);
            if t[w].is_nan() {
                t[w] = o.start_s;
            }
            assert_eq!(t[w], o.start_s, "wave {w} starts at one moment");
        }
        assert!(t[1..].windows(2).all(|w| w[0] < w[1]), "{t:?}");
        // Every later wave waits for something, and only for what the
        // plan had ended by its start; what the plan had ended by then
        // is waited for by then.
        for w in 2..=last {
            assert!(
                ms.iter()
                    .any(|m| label(m, BEFORE_WAVE_LABEL) == Some(&w.to_string())),
                "wave {w} waits for nothing"
            );
        }
        for m in &ms {
            let o = of(m);
            let released = o.end_s - o.downtime_ms / 1e3;
            let gate: Option<usize> = label(m, BEFORE_WAVE_LABEL).map(|g| g.parse().unwrap());
            if let Some(g) = gate {
                assert!(g > wave(m), "{m}");
                assert!(released <= t[g] + 1e-6, "{m} gates wave {g} at {}", t[g]);
            }
            for (w, &tw) in t.iter().enumerate().skip(wave(m) + 1) {
                if released <= tw - 1e-6 {
                    assert!(gate.is_some_and(|g| g <= w), "{m} ended before wave {w}");
                }
            }
        }
        // Each VM's downtime target is met in the plan.
        assert_eq!(outcome.over_target, 0);
    }
}

#[test]
fn a_plan_that_cannot_be_met_names_the_vm() {
    // Nowhere to go: the planner says so, and which VM.
    let mut fleet = two_racks();
    fleet.vms[7].memory_bytes = 1 << 50;
    match export::plan_kubevirt(&fleet, 1, &opts()) {
        Err(e @ ExportError::Unplannable(_)) => {
            let why = e.to_string();
            assert!(
                why.contains("VM vm7") && why.contains("no host takes it"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A VM that does not converge, and one over its target (ferry's model
    // throttles writers until any target is met, so the outcome is edited).
    let fleet = two_racks();
    let outcome = run(&fleet, &mut ferry_fleet::Planner::new(), 1).unwrap();
    let mut stuck = outcome.clone();
    stuck.vms[3].converged = false;
    stuck.vms[3].downtime_ms = 900.0;
    let name = stuck.vms[3].vm.clone();
    let err = export::kubevirt(&fleet, &stuck, &opts()).unwrap_err();
    assert!(
        matches!(err, ExportError::DoesNotConverge { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains(&format!("VM {name} does not converge")),
        "{err}"
    );
    let mut over = outcome.clone();
    over.vms[5].downtime_ms = over.vms[5].downtime_target_ms + 1.0;
    let name = over.vms[5].vm.clone();
    let err = export::kubevirt(&fleet, &over, &opts()).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("VM {name} is over its downtime target")),
        "{err}"
    );
    // A VM the plan leaves behind.
    let fleet = two_racks();
    let mut short = outcome.clone();
    let gone = short.vms.remove(0).vm;
    let err = export::kubevirt(&fleet, &short, &opts()).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("VM {gone}: it is on a drained host")),
        "{err}"
    );
    // Only the planner's plan.
    let nova = run(&fleet, &mut Admission::nova(), 1).unwrap();
    assert_eq!(
        export::kubevirt(&fleet, &nova, &opts()),
        Err(ExportError::NotThePlanner("nova".into()))
    );
}

#[test]
fn names_kubernetes_would_refuse_are_refused() {
    let mut fleet = two_racks();
    fleet.vms[2].name = "VM_2".into();
    let err = export::plan_kubevirt(&fleet, 1, &opts()).unwrap_err();
    assert!(err.to_string().contains("VM \"VM_2\""), "{err}");
    let mut fleet = two_racks();
    fleet.vms[4].name = "vm1".into();
    let err = export::plan_kubevirt(&fleet, 1, &opts()).unwrap_err();
    assert!(
        err.to_string().contains("two VMs are called \"vm1\""),
        "{err}"
    );
    let fleet = two_racks();
    let bad = KubeVirtOptions {
        namespace: Some("My VMs".into()),
    };
    let err = export::plan_kubevirt(&fleet, 1, &bad).unwrap_err();
    assert!(err.to_string().contains("namespace \"My VMs\""), "{err}");
}
