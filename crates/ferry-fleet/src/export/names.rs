//! Names and numbers in the forms Kubernetes takes: object names, label
//! values, quantities, and annotation numbers.

use super::ExportError;
use std::collections::HashMap;

/// The migration of the VMI called `vm`.
pub(super) fn migration_name(vm: &str) -> String {
    format!("ferry-{vm}")
}

/// A figure for an annotation: at most 3 decimals, no trailing zeros.
pub(super) fn number(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `mib` MiB as a Kubernetes quantity in canonical form (`953Mi`, `1Gi`).
pub(super) fn quantity_mib(mib: u64) -> String {
    let (mut n, mut unit) = (mib, 0);
    while n % 1024 == 0 && unit < 4 {
        n /= 1024;
        unit += 1;
    }
    format!("{n}{}", ["Mi", "Gi", "Ti", "Pi", "Ei"][unit])
}

/// Each name's index, or the first name given twice. VMIs are named
/// uniquely in a namespace and nodes in a cluster, and the plan's outcome
/// names VMs and hosts.
pub(super) fn index_names<'a>(
    names: impl Iterator<Item = &'a str>,
    what: &'static str,
) -> Result<HashMap<&'a str, usize>, ExportError> {
    let mut index = HashMap::new();
    for (i, name) in names.enumerate() {
        if index.insert(name, i).is_some() {
            return Err(ExportError::Duplicate {
                what,
                name: name.into(),
                why: "Kubernetes names each VMI and node once, and the plan names them",
            });
        }
    }
    Ok(index)
}

/// An object name: a DNS-1123 subdomain (RFC 1123), as Kubernetes checks it.
pub(super) fn dns_subdomain(s: &str) -> Result<(), String> {
    let rule = "lower-case letters, digits, '-' and '.', beginning and ending with a \
                letter or digit, at most 253 characters (a DNS-1123 subdomain)";
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(rule.into())
    }
}

/// A namespace: a DNS-1123 label.
pub(super) fn dns_label(s: &str) -> Result<(), String> {
    if s.len() <= 63 && !s.contains('.') && dns_subdomain(s).is_ok() {
        Ok(())
    } else {
        Err(
            "lower-case letters, digits and '-', beginning and ending with a letter or \
             digit, at most 63 characters (a DNS-1123 label)"
                .into(),
        )
    }
}

/// A label value: at most 63 characters, letters, digits, '-', '_' and
/// '.', beginning and ending with a letter or digit.
pub(super) fn label_value(s: &str) -> Result<(), String> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && alnum(s.chars().next())
        && alnum(s.chars().last());
    if ok {
        Ok(())
    } else {
        Err(
            "at most 63 letters, digits, '-', '_' and '.', beginning and ending with a \
             letter or digit (a label value)"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(quantity_mib(953), "953Mi");
        assert_eq!(quantity_mib(1024), "1Gi");
        assert_eq!(quantity_mib(3 * 1024 * 1024), "3Ti");
        assert_eq!(quantity_mib(1536), "1536Mi");
    }

    #[test]
    fn names_follow_kubernetes_rules() {
        assert!(dns_subdomain("ferry-vm-1.a").is_ok());
        for bad in ["", "Vm", "vm_1", "-vm", "vm-", "a..b"] {
            assert!(dns_subdomain(bad).is_err(), "{bad}");
        }
        assert!(dns_label("a.b").is_err());
        assert!(label_value("Host_1.x").is_ok());
        assert!(label_value("_h").is_err());
        assert!(label_value(&"h".repeat(64)).is_err());
    }

    #[test]
    fn annotation_numbers_are_short() {
        assert_eq!(number(300.0), "300");
        assert_eq!(number(12.25), "12.25");
        assert_eq!(number(0.0001), "0");
    }
}
