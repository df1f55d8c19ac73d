//! The API server's object store: every object kept as JSON, stamped with a
//! cluster-wide `resourceVersion`, and a bounded log of changes that watches
//! read from.
//!
//! One lock guards the objects, the counter and the log, and a change is
//! published while that lock is held: a watch that takes its backlog and
//! subscribes under the same lock sees every change exactly once.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::resources::Resource;
use crate::e2b::sandbox::lock;

/// How many changes the log keeps; a watch from an older version gets 410.
const LOG_LEN: usize = 4096;

/// An API error, answered as a `Status` object.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn not_found(plural: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{plural} \"{name}\" not found"))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// The `Status` body.
    pub fn status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Where an object lives: its resource (`pods`, `sandboxes.agents.x-k8s.io`),
/// namespace (empty when cluster-scoped) and name.
pub type Key = (&'static str, String, String);

/// One change to one object, as a watch reports it.
#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    pub resource: &'static str,
    pub namespace: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    pub object: Value,
}

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    log: VecDeque<Change>,
}

/// The store.
pub struct Store {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Change>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            inner: Mutex::new(Inner {
                rv: 1000,
                objects: BTreeMap::new(),
                log: VecDeque::new(),
            }),
            changes: broadcast::channel(LOG_LEN).0,
        }
    }
}

/// What a watch starts from: the changes after its version, and the
/// changes still to come.
pub struct Subscription {
    /// The store's version when the subscription was taken.
    pub version: u64,
    pub backlog: Vec<Change>,
    pub live: broadcast::Receiver<Change>,
}

fn key(res: &Resource, ns: &str, name: &str) -> Key {
    (
        res.id,
        if res.namespaced {
            ns.to_string()
        } else {
            String::new()
        },
        name.to_string(),
    )
}

impl Store {
    /// The current resourceVersion.
    pub fn version(&self) -> u64 {
        lock(&self.inner).rv
    }

    /// Store a new object, filling in the metadata the server owns.
    pub fn create(&self, res: &Resource, ns: &str, mut obj: Value) -> ApiResult<Value> {
        let mut g = lock(&self.inner);
        if res.namespaced {
            let nsk: Key = ("namespaces", String::new(), ns.to_string());
            if !g.objects.contains_key(&nsk) {
                return Err(ApiError::not_found("namespaces", ns));
            }
        }
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| ApiError::bad_request("the object has no metadata"))?;
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) => format!("{prefix}{}", suffix()),
                None => {
                    return Err(ApiError::invalid(format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        res.kind
                    )));
                }
            },
        };
        check_name(res, &name)?;
        let k = key(res, ns, &name);
        if g.objects.contains_key(&k) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.plural),
            ));
        }
        g.rv += 1;
        let rv = g.rv;
        meta.insert("name".into(), json!(name));
        if res.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), json!(uid()));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert(
            "creationTimestamp".into(),
            json!(crate::e2b::rfc3339(crate::e2b::sandbox::now_unix())),
        );
        if res.kind != "Pod" {
            meta.insert("generation".into(), json!(1));
        }
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        g.objects.insert(k, obj.clone());
        self.publish(&mut g, res, ns, "ADDED", &obj);
        Ok(obj)
    }

    pub fn get(&self, res: &Resource, ns: &str, name: &str) -> ApiResult<Value> {
        lock(&self.inner)
            .objects
            .get(&key(res, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(res.plural, name))
    }

    /// Every object of `res` (in `ns`, or in all namespaces when `None`),
    /// with the version the list is as of.
    pub fn list(&self, res: &Resource, ns: Option<&str>) -> (Vec<Value>, u64) {
        let g = lock(&self.inner);
        let items = g
            .objects
            .iter()
            .filter(|((r, n, _), _)| *r == res.id && ns.is_none_or(|ns| !res.namespaced || n == ns))
            .map(|(_, v)| v.clone())
            .collect();
        (items, g.rv)
    }

    /// Change an object in place. `f` may refuse; the change is stored and
    /// published only when `f` returns `Ok` and left the object different.
    pub fn update(
        &self,
        res: &Resource,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value) -> ApiResult<()>,
    ) -> ApiResult<Value> {
        let mut g = lock(&self.inner);
        let k = key(res, ns, name);
        let Some(old) = g.objects.get(&k).cloned() else {
            return Err(ApiError::not_found(res.plural, name));
        };
        let mut obj = old.clone();
        f(&mut obj)?;
        // What the server owns stays the server's.
        for field in ["name", "namespace", "uid", "creationTimestamp"] {
            match old["metadata"].get(field) {
                Some(v) => obj["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = obj["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if obj == old {
            return Ok(old);
        }
        if obj.get("spec") != old.get("spec") && res.kind != "Pod" {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            obj["metadata"]["generation"] = json!(generation + 1);
        }
        g.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(g.rv.to_string());
        g.objects.insert(k, obj.clone());
        self.publish(&mut g, res, ns, "MODIFIED", &obj);
        Ok(obj)
    }

    /// Replace an object (PUT). A `resourceVersion` in `new` must match.
    pub fn replace(&self, res: &Resource, ns: &str, name: &str, new: Value) -> ApiResult<Value> {
        let want = new["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        self.update(res, ns, name, |obj| {
            if let Some(want) = want
                && obj["metadata"]["resourceVersion"].as_str() != Some(want.as_str())
            {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                        res.plural
                    ),
                ));
            }
            // A status is the status subresource's to change.
            let status = obj.get("status").cloned();
            *obj = new;
            match status {
                Some(s) => obj["status"] = s,
                None => {
                    if let Some(m) = obj.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            Ok(())
        })
    }

    /// Remove an object; answers it as it was last, with a
    /// `deletionTimestamp`.
    pub fn delete(&self, res: &Resource, ns: &str, name: &str) -> ApiResult<Value> {
        let mut g = lock(&self.inner);
        let Some(mut obj) = g.objects.remove(&key(res, ns, name)) else {
            return Err(ApiError::not_found(res.plural, name));
        };
        g.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(g.rv.to_string());
        obj["metadata"]["deletionTimestamp"] =
            json!(crate::e2b::rfc3339(crate::e2b::sandbox::now_unix()));
        self.publish(&mut g, res, ns, "DELETED", &obj);
        Ok(obj)
    }

    /// Every change to come, of every resource: what a controller reads.
    pub fn changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// The changes after `since` (every object as `ADDED` when `None`) and a
    /// receiver for the rest. A `since` older than the log answers 410.
    pub fn subscribe(
        &self,
        res: &Resource,
        ns: Option<&str>,
        since: Option<u64>,
    ) -> ApiResult<Subscription> {
        let g = lock(&self.inner);
        let backlog = match since {
            None => g
                .objects
                .iter()
                .filter(|((r, n, _), _)| {
                    *r == res.id && ns.is_none_or(|ns| !res.namespaced || n == ns)
                })
                .map(|((_, n, _), v)| Change {
                    rv: g.rv,
                    resource: res.id,
                    namespace: n.clone(),
                    kind: "ADDED",
                    object: v.clone(),
                })
                .collect(),
            Some(since) => {
                let oldest = g.log.front().map(|c| c.rv).unwrap_or(g.rv + 1);
                if since + 1 < oldest && since < g.rv {
                    return Err(ApiError::new(
                        410,
                        "Expired",
                        format!("too old resource version: {since} ({})", oldest - 1),
                    ));
                }
                g.log
                    .iter()
                    .filter(|c| c.rv > since && c.resource == res.id)
                    .cloned()
                    .collect()
            }
        };
        Ok(Subscription {
            version: g.rv,
            backlog,
            live: self.changes.subscribe(),
        })
    }

    fn publish(&self, g: &mut Inner, res: &Resource, ns: &str, kind: &'static str, obj: &Value) {
        let change = Change {
            rv: g.rv,
            resource: res.id,
            namespace: if res.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            kind,
            object: obj.clone(),
        };
        if g.log.len() == LOG_LEN {
            g.log.pop_front();
        }
        g.log.push_back(change.clone());
        // No receiver is not an error: nobody watches.
        let _ = self.changes.send(change);
    }
}

/// A name the API server would take: a DNS-1123 subdomain (a label, for
/// namespaces and pods' hostnames is not checked).
fn check_name(res: &Resource, name: &str) -> ApiResult<()> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "{} \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            res.kind
        )))
    }
}

/// Five characters for `generateName`, from the alphabet Kubernetes uses.
fn suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn uid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}
