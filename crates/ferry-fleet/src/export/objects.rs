//! KubeVirt's objects as the export writes them, written by hand to
//! KubeVirt's OpenAPI schema (`tests/fixtures/kubevirt-swagger.json`):
//! only the fields the export sets.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `metadata`: the part of `ObjectMeta` the export sets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The object's name.
    pub name: String,
    /// Its namespace (`None`: kubectl's current one; a `MigrationPolicy`
    /// is cluster-wide and has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `v1.VirtualMachineInstanceMigration`: migrate one VMI.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigration {
    /// `kubevirt.io/v1`.
    pub api_version: String,
    /// `VirtualMachineInstanceMigration`.
    pub kind: String,
    /// Its name, labels and annotations.
    pub metadata: ObjectMeta,
    /// What to migrate, and where it may go.
    pub spec: MigrationSpec,
}

/// `v1.VirtualMachineInstanceMigrationSpec`, the fields the export sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationSpec {
    /// The VMI, in the migration's namespace.
    pub vmi_name: String,
    /// Node labels the target must have, on top of the VM's own
    /// constraints (KubeVirt 1.6 and later).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub added_node_selector: BTreeMap<String, String>,
}

/// `v1alpha1.MigrationPolicy`: migration settings for the VMIs it selects
/// (cluster-wide; of several that match a VMI, KubeVirt takes the one
/// matching most labels).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPolicy {
    /// `migrations.kubevirt.io/v1alpha1`.
    pub api_version: String,
    /// `MigrationPolicy`.
    pub kind: String,
    /// Its name, labels and annotations.
    pub metadata: ObjectMeta,
    /// The settings and whom they apply to.
    pub spec: MigrationPolicySpec,
}

/// `v1alpha1.MigrationPolicySpec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPolicySpec {
    /// Whom it applies to.
    pub selectors: Selectors,
    /// QEMU's auto-converge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_auto_converge: Option<bool>,
    /// Each migration's bandwidth cap, a quantity (`953Mi`: MiB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_per_migration: Option<String>,
    /// Seconds per GB of memory before a migration is aborted.
    #[serde(
        rename = "completionTimeoutPerGiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub completion_timeout_per_gib: Option<i64>,
    /// Whether a migration may switch to postcopy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_post_copy: Option<bool>,
}

/// `v1alpha1.Selectors`: labels a VMI (and its namespace) must all have.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selectors {
    /// Labels of the VMI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_instance_selector: Option<BTreeMap<String, String>>,
    /// Labels of its namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<BTreeMap<String, String>>,
}

/// One object of the export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Object {
    /// A `MigrationPolicy`.
    Policy(MigrationPolicy),
    /// A `VirtualMachineInstanceMigration`.
    Migration(VirtualMachineInstanceMigration),
}

/// A `v1` `List`: what `kubectl create -f` reads as many objects.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct List {
    /// `v1`.
    pub api_version: String,
    /// `List`.
    pub kind: String,
    /// The objects, in the order to create them.
    pub items: Vec<Object>,
}
