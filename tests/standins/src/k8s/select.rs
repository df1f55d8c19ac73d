//! Label and field selectors, as `labelSelector=` and `fieldSelector=` carry
//! them: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`,
//! joined by commas; fields take `=`, `==` and `!=` on the paths the API
//! server indexes for pods (`metadata.name`, `metadata.namespace`,
//! `spec.nodeName`, `status.phase`).

use serde_json::Value;

use super::store::{ApiError, ApiResult};

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

/// Split on commas outside parentheses.
fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn set(text: &str) -> ApiResult<Vec<String>> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {text:?}: expected a set in parentheses"
            ))
        })?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

fn parse(text: &str, fields: bool) -> ApiResult<Vec<Req>> {
    let mut out = Vec::new();
    for t in terms(text) {
        let req = if let Some((k, v)) = t.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = t.split_once("==") {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = t.split_once('=') {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if fields {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{t}'; can't understand '{t}'"
            )));
        } else if let Some((k, v)) = t.split_once(" notin ") {
            Req::NotIn(k.trim().into(), set(v)?)
        } else if let Some((k, v)) = t.split_once(" in ") {
            Req::In(k.trim().into(), set(v)?)
        } else if let Some(k) = t.strip_prefix('!') {
            Req::Absent(k.trim().into())
        } else {
            Req::Exists(t.clone())
        };
        out.push(req);
    }
    Ok(out)
}

impl Selector {
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> ApiResult<Selector> {
        Ok(Selector {
            labels: parse(labels.unwrap_or(""), false)?,
            fields: parse(fields.unwrap_or(""), true)?,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        let field = |k: &str| {
            let mut v = obj;
            for part in k.split('.') {
                v = &v[part];
            }
            v.as_str().unwrap_or("")
        };
        self.labels.iter().all(|r| holds(r, &label))
            && self.fields.iter().all(|r| holds(r, &|k| Some(field(k))))
    }
}

fn holds<'a>(r: &Req, get: &dyn Fn(&str) -> Option<&'a str>) -> bool {
    match r {
        Req::Eq(k, v) => get(k) == Some(v.as_str()),
        Req::Ne(k, v) => get(k) != Some(v.as_str()),
        Req::Exists(k) => get(k).is_some(),
        Req::Absent(k) => get(k).is_none(),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Req::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
    }
}

/// Whether a pod-selector object (`matchLabels`, `matchExpressions`)
/// selects the labels of `obj`. The empty selector selects every pod.
pub fn label_selector_selects(selector: &Value, obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    let by_labels = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| label(k) == v.as_str()));
    let by_exprs = selector["matchExpressions"].as_array().is_none_or(|xs| {
        xs.iter().all(|x| {
            let k = x["key"].as_str().unwrap_or("");
            let values: Vec<&str> = x["values"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match x["operator"].as_str() {
                Some("In") => label(k).is_some_and(|v| values.contains(&v)),
                Some("NotIn") => label(k).is_none_or(|v| !values.contains(&v)),
                Some("Exists") => label(k).is_some(),
                Some("DoesNotExist") => label(k).is_none(),
                _ => false,
            }
        })
    });
    by_labels && by_exprs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_read_as_the_api_server_reads_them() -> ApiResult<()> {
        let pod = json!({"metadata": {"name": "p", "labels": {"app": "berth", "tier": "a"}}, "spec": {"nodeName": "n1"}});
        for (labels, fields, want) in [
            ("app=berth", "", true),
            ("app==berth,tier!=b", "", true),
            ("app in (x, berth)", "", true),
            ("tier notin (a)", "", false),
            ("!gone,app", "", true),
            ("gone", "", false),
            ("", "metadata.name=p,spec.nodeName=n1", true),
            ("", "spec.nodeName!=n1", false),
        ] {
            let s = Selector::parse(Some(labels), Some(fields))?;
            assert_eq!(s.matches(&pod), want, "{labels:?} {fields:?}");
        }
        assert!(Selector::parse(None, Some("name")).is_err());
        Ok(())
    }
}
