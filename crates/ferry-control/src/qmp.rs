//! QMP's requests: `{"execute": NAME, "arguments": {...}, "id": ...}`.

use super::{MigrateRequest, SnapshotRequest};
use ferry_engine::choices::ConvergeMode;
use ferry_engine::TunableChange;
use serde_json::{Map, Value};

/// A refusal in QMP's shape: `{"error": {"class": ..., "desc": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QmpError {
    /// `GenericError` or `CommandNotFound`.
    pub class: &'static str,
    /// What was wrong, for a person.
    pub desc: String,
}

impl QmpError {
    /// A `GenericError`.
    pub fn generic(desc: impl Into<String>) -> Self {
        QmpError {
            class: "GenericError",
            desc: desc.into(),
        }
    }
}

/// The parameters `migrate-set-parameters` takes; `None` leaves one as it is.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ParamUpdate {
    /// `downtime-limit` (ms), `max-bandwidth` (bytes/s, 0: no cap),
    /// `x-max-rounds` and `x-quota-interval` (ms): the engine's own live
    /// tunables, which it checks.
    pub tunables: TunableChange,
    /// `x-converge`: a policy, by its name.
    pub converge: Option<ConvergeMode>,
}

/// The capabilities ferry has: two choose a convergence policy, and
/// `postcopy-ram` lets a migration switch to postcopy when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// `auto-converge`: QEMU's policy.
    AutoConverge,
    /// `dirty-limit`: QEMU 8.1's policy.
    DirtyLimit,
    /// The next migration runs as a hybrid that stays in precopy until
    /// `migrate-start-postcopy` (or its round cap), as QEMU's does.
    PostcopyRam,
}

impl Capability {
    /// The convergence policy it chooses, if it chooses one.
    pub fn policy(self) -> Option<ConvergeMode> {
        match self {
            Capability::AutoConverge => Some(ConvergeMode::Auto),
            Capability::DirtyLimit => Some(ConvergeMode::DirtyLimit),
            Capability::PostcopyRam => None,
        }
    }
}

/// A QMP command ferry answers.
#[derive(Debug)]
pub enum QmpCommand {
    /// `qmp_capabilities`: ends the negotiation.
    Capabilities,
    /// `query-migrate`.
    QueryMigrate,
    /// `query-migrate-parameters`.
    QueryParameters,
    /// `query-migrate-capabilities`.
    QueryCapabilities,
    /// `migrate-set-parameters`.
    SetParameters(ParamUpdate),
    /// `migrate-set-capabilities`: each capability and its new state.
    SetCapabilities(Vec<(Capability, bool)>),
    /// `migrate`: a new migration (`settings`), or with `resume` the
    /// resume of a paused postcopy at `settings.to`.
    Migrate {
        /// Resume a paused postcopy instead of starting a migration.
        resume: bool,
        /// Where to, and how.
        settings: Box<MigrateRequest>,
    },
    /// `migrate` to a `file:` URI: a snapshot of the running VM, left
    /// paused afterwards as QEMU's is, unless `stop` is false.
    Snapshot(Box<SnapshotRequest>),
    /// `migrate_cancel`.
    Cancel,
    /// `migrate-start-postcopy`: a running hybrid switches at the end of
    /// its round.
    StartPostcopy,
    /// `cont`: resumes a paused VM, or one held paused after a lost Commit.
    Cont,
    /// `stop`: pauses the VM; the VMM runs on.
    Stop,
    /// `query-status`: whether the VM runs, in QEMU's run-state names.
    QueryStatus,
    /// `query-version`: QEMU's shape, ferry named in `package`.
    QueryVersion,
    /// `query-commands`: the commands this monitor implements.
    QueryCommands,
    /// `query-name`: the VM's name (ferry's VMs have none).
    QueryName,
    /// `quit`: the VMM stops (a precopy under way is cancelled first).
    Quit,
}

/// Every command a QMP client may send to ferry, as `query-commands` lists
/// them.
pub const COMMANDS: [&str; 16] = [
    "qmp_capabilities",
    "query-commands",
    "query-version",
    "query-name",
    "query-status",
    "query-migrate",
    "query-migrate-parameters",
    "query-migrate-capabilities",
    "migrate-set-parameters",
    "migrate-set-capabilities",
    "migrate",
    "migrate_cancel",
    "migrate-start-postcopy",
    "cont",
    "stop",
    "quit",
];

/// The parameter names `migrate-set-parameters` knows.
pub const PARAMETERS: [&str; 5] = [
    "downtime-limit",
    "max-bandwidth",
    "x-max-rounds",
    "x-converge",
    "x-quota-interval",
];

fn number(args: &Map<String, Value>, key: &str) -> Result<Option<u64>, QmpError> {
    match args.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| QmpError::generic(format!("parameter '{key}' expects a whole number"))),
    }
}

/// Parses a request object that has `execute`.
pub fn parse(request: &Map<String, Value>) -> Result<QmpCommand, QmpError> {
    let Some(name) = request.get("execute").and_then(Value::as_str) else {
        return Err(QmpError::generic(
            "'execute' must be a string naming a command",
        ));
    };
    if let Some(key) = request
        .keys()
        .find(|k| !matches!(k.as_str(), "execute" | "arguments" | "id"))
    {
        return Err(QmpError::generic(format!(
            "QMP input member '{key}' is unexpected"
        )));
    }
    let empty = Map::new();
    let args = match request.get("arguments") {
        None => &empty,
        Some(Value::Object(a)) => a,
        Some(_) => return Err(QmpError::generic("'arguments' must be an object")),
    };
    let no_args = |command: QmpCommand| match args.keys().next() {
        Some(k) => Err(QmpError::generic(format!("parameter '{k}' is unexpected"))),
        None => Ok(command),
    };
    match name {
        "qmp_capabilities" => no_args(QmpCommand::Capabilities),
        "query-migrate" => no_args(QmpCommand::QueryMigrate),
        "query-migrate-parameters" => no_args(QmpCommand::QueryParameters),
        "query-migrate-capabilities" => no_args(QmpCommand::QueryCapabilities),
        "migrate_cancel" => no_args(QmpCommand::Cancel),
        "migrate-start-postcopy" => no_args(QmpCommand::StartPostcopy),
        "cont" => no_args(QmpCommand::Cont),
        "stop" => no_args(QmpCommand::Stop),
        "query-status" => no_args(QmpCommand::QueryStatus),
        "query-version" => no_args(QmpCommand::QueryVersion),
        "query-commands" => no_args(QmpCommand::QueryCommands),
        "query-name" => no_args(QmpCommand::QueryName),
        "quit" => no_args(QmpCommand::Quit),
        "migrate-set-parameters" => set_parameters(args),
        "migrate-set-capabilities" => set_capabilities(args),
        "migrate" => migrate(args),
        other => Err(QmpError {
            class: "CommandNotFound",
            desc: format!("the command {other} has not been found"),
        }),
    }
}

fn set_parameters(args: &Map<String, Value>) -> Result<QmpCommand, QmpError> {
    if let Some(k) = args.keys().find(|k| !PARAMETERS.contains(&k.as_str())) {
        return Err(QmpError::generic(format!(
            "parameter '{k}' is not supported by ferry (supported: {})",
            PARAMETERS.join(", ")
        )));
    }
    let max_rounds = number(args, "x-max-rounds")?
        .map(|r| u32::try_from(r).map_err(|_| QmpError::generic("x-max-rounds is too large")))
        .transpose()?;
    let converge = match args.get("x-converge") {
        None => None,
        Some(Value::String(s)) => Some(
            s.parse::<ConvergeMode>()
                .map_err(|e| QmpError::generic(format!("parameter 'x-converge': {e}")))?,
        ),
        Some(_) => return Err(QmpError::generic("parameter 'x-converge' expects a string")),
    };
    Ok(QmpCommand::SetParameters(ParamUpdate {
        tunables: TunableChange {
            downtime_ms: number(args, "downtime-limit")?,
            bandwidth_bytes_per_sec: number(args, "max-bandwidth")?,
            max_rounds,
            quota_interval_ms: number(args, "x-quota-interval")?,
        },
        converge,
    }))
}

fn set_capabilities(args: &Map<String, Value>) -> Result<QmpCommand, QmpError> {
    let Some(Value::Array(list)) = args.get("capabilities") else {
        return Err(QmpError::generic(
            "migrate-set-capabilities needs 'capabilities', a list",
        ));
    };
    let mut out = Vec::with_capacity(list.len());
    for cap in list {
        let (Some(name), Some(state)) = (
            cap.get("capability").and_then(Value::as_str),
            cap.get("state").and_then(Value::as_bool),
        ) else {
            return Err(QmpError::generic(
                "each capability needs 'capability' (a name) and 'state' (true or false)",
            ));
        };
        let cap = match name {
            "auto-converge" => Capability::AutoConverge,
            "dirty-limit" => Capability::DirtyLimit,
            "postcopy-ram" => Capability::PostcopyRam,
            other => {
                return Err(QmpError::generic(format!(
                    "capability '{other}' is not supported by ferry (supported: auto-converge, \
                     dirty-limit, postcopy-ram; use x-converge for the other policies)"
                )))
            }
        };
        out.push((cap, state));
    }
    let on: Vec<_> = out
        .iter()
        .filter(|(c, s)| *s && c.policy().is_some())
        .map(|(c, _)| *c)
        .collect();
    if on.windows(2).any(|w| w[0] != w[1]) {
        return Err(QmpError::generic(
            "auto-converge and dirty-limit are exclusive: choose one",
        ));
    }
    Ok(QmpCommand::SetCapabilities(out))
}

/// `migrate` to `file:PATH`: a snapshot in ferry's own format (pages at
/// fixed places, as `mapped-ram` has them), which ferry's restore reads.
fn snapshot(path: &str, args: &Map<String, Value>) -> Result<QmpCommand, QmpError> {
    if path.contains(",offset=") {
        return Err(QmpError::generic(format!(
            "uri 'file:{path}': ferry writes its own file from its start; \
             an offset into a file is not supported"
        )));
    }
    if !path.starts_with('/') {
        return Err(QmpError::generic(format!(
            "uri 'file:{path}': the path must be absolute (the VM's process does not \
             share its client's working directory)"
        )));
    }
    if args.contains_key("resume") {
        return Err(QmpError::generic("a snapshot to a file cannot be resumed"));
    }
    // ferry's own settings, with QMP's dashes or the socket's underscores.
    let mut fields: Map<String, Value> = args
        .iter()
        .filter(|(k, _)| k.as_str() != "uri")
        .map(|(k, v)| (k.replace('-', "_"), v.clone()))
        .collect();
    fields.insert("path".into(), Value::String(path.to_string()));
    // As QEMU: the guest stays stopped once its state is in the file.
    fields.entry("stop").or_insert(Value::Bool(true));
    let request: SnapshotRequest = serde_json::from_value(Value::Object(fields))
        .map_err(|e| QmpError::generic(format!("bad migrate arguments for a file: {e}")))?;
    if let Some(parent) = request.parent.as_ref().filter(|p| !p.is_absolute()) {
        return Err(QmpError::generic(format!(
            "parent '{}': the path must be absolute",
            parent.display()
        )));
    }
    Ok(QmpCommand::Snapshot(Box::new(request)))
}

fn migrate(args: &Map<String, Value>) -> Result<QmpCommand, QmpError> {
    let Some(uri) = args.get("uri").and_then(Value::as_str) else {
        return Err(QmpError::generic(
            "migrate needs 'uri', e.g. \"tcp:10.0.0.2:7070\"",
        ));
    };
    if let Some(path) = uri.strip_prefix("file:") {
        return snapshot(path, args);
    }
    let Some(to) = uri.strip_prefix("tcp:") else {
        return Err(QmpError::generic(format!(
            "uri '{uri}': ferry migrates over tcp (tcp:HOST:PORT; TLS with tls-dir), \
             or saves to a file (file:PATH)"
        )));
    };
    let resume = match args.get("resume") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(QmpError::generic(
                "parameter 'resume' expects true or false",
            ))
        }
    };
    // ferry's own settings, with QMP's dashes or the socket's underscores.
    let mut fields: Map<String, Value> = args
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "uri" | "resume"))
        .map(|(k, v)| (k.replace('-', "_"), v.clone()))
        .collect();
    fields.insert("to".into(), Value::String(to.to_string()));
    let settings: MigrateRequest = serde_json::from_value(Value::Object(fields))
        .map_err(|e| QmpError::generic(format!("bad migrate arguments: {e}")))?;
    Ok(QmpCommand::Migrate {
        resume,
        settings: Box::new(settings),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<QmpCommand, QmpError> {
        let v: Value = serde_json::from_str(s).unwrap();
        parse(v.as_object().unwrap())
    }

    #[test]
    fn every_listed_command_parses_and_an_unknown_one_is_not_found() {
        for name in COMMANDS {
            let got = parse_str(&format!(r#"{{"execute":"{name}"}}"#));
            // A command that wants arguments refuses their absence in
            // words (GenericError), never as unknown.
            assert!(
                got.as_ref()
                    .map_or_else(|e| e.class != "CommandNotFound", |_| true),
                "{name}"
            );
        }
        let unknown = parse_str(r#"{"execute":"query-cpus-fast"}"#).unwrap_err();
        assert_eq!(unknown.class, "CommandNotFound");
    }

    #[test]
    fn commands_parse_with_their_arguments() {
        assert!(matches!(
            parse_str(r#"{"execute":"query-migrate"}"#),
            Ok(QmpCommand::QueryMigrate)
        ));
        assert!(matches!(
            parse_str(r#"{"execute":"cont"}"#),
            Ok(QmpCommand::Cont)
        ));
        assert!(matches!(
            parse_str(r#"{"execute":"migrate-start-postcopy"}"#),
            Ok(QmpCommand::StartPostcopy)
        ));
        assert!(matches!(
            parse_str(
                r#"{"execute":"migrate-set-capabilities","arguments":{"capabilities":[
                {"capability":"postcopy-ram","state":true},{"capability":"dirty-limit","state":true}]}}"#
            ),
            Ok(QmpCommand::SetCapabilities(_))
        ));
        let Ok(QmpCommand::SetParameters(p)) = parse_str(
            r#"{"execute":"migrate-set-parameters","arguments":{"downtime-limit":9,"x-converge":"auto"}}"#,
        ) else {
            panic!("set-parameters did not parse");
        };
        assert_eq!(p.tunables.downtime_ms, Some(9));
        assert_eq!(p.converge, Some(ConvergeMode::Auto));
        let Ok(QmpCommand::Migrate { resume, settings }) =
            parse_str(r#"{"execute":"migrate","arguments":{"uri":"tcp:h:1","stall-timeout-s":3}}"#)
        else {
            panic!("migrate did not parse");
        };
        assert!(!resume);
        assert_eq!(settings.to, "h:1");
        assert_eq!(settings.stall_timeout_s, Some(3));
        let Ok(QmpCommand::Snapshot(file)) =
            parse_str(r#"{"execute":"migrate","arguments":{"uri":"file:/s/vm.snap"}}"#)
        else {
            panic!("migrate to a file did not parse");
        };
        assert_eq!(file.path, std::path::Path::new("/s/vm.snap"));
        assert!(file.stop, "QEMU leaves the guest stopped after a file");
        let Ok(QmpCommand::Snapshot(file)) = parse_str(
            r#"{"execute":"migrate","arguments":{"uri":"file:/v","stop":false,"max-rounds":3}}"#,
        ) else {
            panic!("migrate to a file with ferry's settings did not parse");
        };
        assert!(!file.stop);
        assert_eq!(file.max_rounds, Some(3));
    }

    #[test]
    fn refusals_name_what_was_wrong() {
        let class = |s| parse_str(s).unwrap_err().class;
        assert_eq!(class(r#"{"execute":"boom"}"#), "CommandNotFound");
        assert_eq!(
            class(r#"{"execute":"migrate_cancel","arguments":{"a":1}}"#),
            "GenericError"
        );
        let desc = |s| parse_str(s).unwrap_err().desc;
        assert!(desc(r#"{"execute":"migrate","arguments":{"uri":"exec:x"}}"#).contains("tcp"));
        assert!(
            desc(r#"{"execute":"migrate","arguments":{"uri":"file:rel"}}"#).contains("absolute")
        );
        assert!(
            desc(r#"{"execute":"migrate","arguments":{"uri":"file:/f,offset=4096"}}"#)
                .contains("offset")
        );
        assert!(
            desc(r#"{"execute":"migrate","arguments":{"uri":"file:/f","connections":2}}"#)
                .contains("connections")
        );
        assert!(desc(
            r#"{"execute":"migrate-set-capabilities","arguments":{"capabilities":[
                {"capability":"auto-converge","state":true},{"capability":"dirty-limit","state":true}]}}"#
        )
        .contains("exclusive"));
        assert_eq!(
            desc(r#"{"execute":"migrate-set-parameters","arguments":{"x-converge":"fast"}}"#),
            r#"parameter 'x-converge': converge "fast": expected one of none, auto, quota, dirty-limit"#
        );
        assert!(
            desc(r#"{"execute":"migrate","arguments":{"uri":"tcp:h:1","mode":"teleport"}}"#)
                .contains(r#"mode "teleport": expected one of precopy, postcopy, hybrid"#)
        );
    }
}
