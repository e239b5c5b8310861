//! The manifest in the strict CBOR profile, alone and inside a hello frame.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use capwire_envelope::{
    Frame, FrameRef, Hello, Limits, NodeId, RawValue, decode_frame, encode_frame, from_slice,
    to_vec,
};
use capwire_manifest::{
    BindArgs, BindReply, Capability, DeclaredClass, Manifest, MonitoringBind, MonitoringDisable,
    MonitoringHandlers, MonitoringStatus, NoArgs, NodeInfo, Registry, RequestVerb, VerbDef,
    VerbKind, VerbSpec, Version,
};

fn manifest() -> Manifest {
    Registry::builder(
        NodeInfo::new(NodeId::from_bytes([0xab; 32]), "echo-app").with_description("echoes"),
        MonitoringHandlers {
            bind: (),
            disable: (),
        },
    )
    .capability(
        Capability::new("app.echo", Version::new(1, 2, 0))
            .params("none")
            .verb_spec(
                VerbSpec::request("say")
                    .class(DeclaredClass::Bootstrap)
                    .handler(()),
            )
            .verb_spec(
                VerbSpec::notification("log")
                    .class(DeclaredClass::Controller)
                    .handler(()),
            ),
    )
    .build()
    .unwrap()
    .manifest(MonitoringStatus::Pending, 9)
}

#[test]
fn round_trips_in_the_strict_profile() {
    let m = manifest();
    let bytes = to_vec(&m).unwrap();
    capwire_envelope::validate(&bytes).unwrap();
    assert_eq!(from_slice::<Manifest>(&bytes).unwrap(), m);
    // Encoding is deterministic.
    assert_eq!(to_vec(&m.clone()).unwrap(), bytes);
}

#[test]
fn the_encoding_is_the_documented_map() {
    let m = manifest();
    let value: ciborium_value::Value = from_slice(&to_vec(&m).unwrap()).unwrap();
    let map = value.as_map().unwrap();
    let keys: Vec<_> = map.iter().map(|(k, _)| k.as_text().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "node_id",
            "app_id",
            "name",
            "description",
            "epoch",
            "monitoring",
            "capabilities"
        ]
    );
    let field = |name: &str| {
        &map.iter()
            .find(|(k, _)| k.as_text() == Some(name))
            .unwrap()
            .1
    };
    assert_eq!(
        field("node_id").as_bytes().unwrap(),
        &vec![0xab; 32],
        "32-byte byte string"
    );
    assert_eq!(field("monitoring").as_text(), Some("pending"));
    assert_eq!(field("epoch").as_integer().map(i128::from), Some(9));
    let caps = field("capabilities").as_array().unwrap();
    let echo = caps[0].as_map().unwrap();
    let keys: Vec<_> = echo.iter().map(|(k, _)| k.as_text().unwrap()).collect();
    assert_eq!(keys, ["id", "version", "params", "verbs"]);
    assert_eq!(echo[1].1.as_text(), Some("1.2.0"));
    let verb = echo[3].1.as_array().unwrap()[0].as_map().unwrap();
    let keys: Vec<_> = verb.iter().map(|(k, _)| k.as_text().unwrap()).collect();
    assert_eq!(
        keys,
        ["name", "kind", "class", "args_schema", "result_schema"]
    );
    assert_eq!(verb[0].1.as_text(), Some("log"));
    assert_eq!(verb[1].1.as_text(), Some("notification"));
    assert_eq!(verb[2].1.as_text(), Some("controller"));
    assert!(
        verb[3].1.is_null() && verb[4].1.is_null(),
        "untyped: null schemas"
    );
}

#[test]
fn peers_manifests_are_checked_on_decode() {
    use ciborium_value::Value;
    let m = manifest();
    let good: Value = from_slice(&to_vec(&m).unwrap()).unwrap();
    type Entries = Vec<(Value, Value)>;
    let edit = |f: &dyn Fn(&mut Entries)| {
        let mut v = good.clone();
        f(v.as_map_mut().unwrap());
        to_vec(&v).unwrap()
    };
    let unknown = edit(&|map| map.push((Value::Text("extra".into()), Value::Bool(true))));
    assert!(from_slice::<Manifest>(&unknown).is_err(), "unknown field");
    let missing = edit(&|map| {
        map.retain(|(k, _)| k.as_text() != Some("epoch"));
    });
    assert!(from_slice::<Manifest>(&missing).is_err(), "missing field");
    let no_params = edit(&|map| {
        for (k, v) in map.iter_mut() {
            if k.as_text() == Some("capabilities") {
                let cap = v.as_array_mut().unwrap()[0].as_map_mut().unwrap();
                cap.retain(|(k, _)| k.as_text() != Some("params"));
            }
        }
    });
    assert!(
        from_slice::<Manifest>(&no_params).is_err(),
        "missing optional key"
    );
    let bad_status = edit(&|map| {
        for (k, v) in map.iter_mut() {
            if k.as_text() == Some("monitoring") {
                *v = Value::Text("ON".into());
            }
        }
    });
    assert!(
        from_slice::<Manifest>(&bad_status).is_err(),
        "unknown status"
    );
    let bad_cap = edit(&|map| {
        for (k, v) in map.iter_mut() {
            if k.as_text() == Some("capabilities") {
                let cap = &mut v.as_array_mut().unwrap()[0];
                cap.as_map_mut().unwrap()[0].1 = Value::Text("App.Echo".into());
            }
        }
    });
    assert!(
        from_slice::<Manifest>(&bad_cap).is_err(),
        "malformed cap id"
    );
    let short_id = edit(&|map| map[0].1 = Value::Bytes(vec![1; 31]));
    assert!(
        from_slice::<Manifest>(&short_id).is_err(),
        "node id of 31 bytes"
    );
}

#[test]
fn travels_in_the_hello_frame() {
    let m = manifest();
    let hello = Hello::new(RawValue::encode(&m).unwrap(), Limits::default());
    let mut record = Vec::new();
    encode_frame(&Frame::Hello(hello), &mut record).unwrap();
    let FrameRef::Hello(received) = decode_frame(&record).unwrap() else {
        panic!("not a hello");
    };
    assert_eq!(received.decode_manifest::<Manifest>().unwrap(), m);
}

#[test]
fn the_bind_reply_round_trips() {
    let reply = BindReply {
        manifest: manifest(),
        members: RawValue::encode(&Vec::<String>::new()).unwrap(),
        config: RawValue::null(),
        version: 4,
    };
    let bytes = to_vec(&reply).unwrap();
    let value: ciborium_value::Value = from_slice(&bytes).unwrap();
    let keys: Vec<_> = value
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, _)| k.as_text().unwrap())
        .collect();
    assert_eq!(keys, ["manifest", "members", "config", "version"]);
    assert_eq!(from_slice::<BindReply>(&bytes).unwrap(), reply);

    let args = to_vec(&BindArgs {
        code: "K7M2Q9XW4P".into(),
    })
    .unwrap();
    assert_eq!(from_slice::<BindArgs>(&args).unwrap().code, "K7M2Q9XW4P");
    assert_eq!(MonitoringBind::VERB, "bind");
    assert!(
        from_slice::<BindArgs>(&to_vec(&NoArgs {}).unwrap()).is_err(),
        "code is required"
    );
}

#[test]
fn bind_args_debug_does_not_show_the_code() {
    let args = BindArgs {
        code: "K7M2Q9XW4P".into(),
    };
    for shown in [
        format!("{args:?}"),
        format!("{args:#?}"),
        format!("{:?}", Some(args.clone())),
    ] {
        assert!(!shown.contains("K7M2Q9XW4P"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
    assert_eq!(format!("{args:?}"), "BindArgs { code: <redacted> }");
    // The code itself still travels.
    assert_eq!(
        from_slice::<BindArgs>(&to_vec(&args).unwrap()).unwrap(),
        args
    );
}

#[test]
fn monitoring_verbs_are_requests() {
    fn request<V: RequestVerb>() -> VerbKind {
        V::KIND
    }
    assert_eq!(request::<MonitoringBind>(), VerbKind::Request);
    assert_eq!(request::<MonitoringDisable>(), VerbKind::Request);
}

#[test]
fn disable_takes_an_empty_map() {
    let empty = to_vec(&NoArgs {}).unwrap();
    assert_eq!(empty, [0xa0], "an empty map");
    assert_eq!(from_slice::<NoArgs>(&empty).unwrap(), NoArgs {});
    let extra = to_vec(&BindArgs { code: "x".into() }).unwrap();
    assert!(from_slice::<NoArgs>(&extra).is_err(), "unknown key");
    assert!(from_slice::<NoArgs>(&[0xf6]).is_err(), "null is not a map");
    assert_eq!(MonitoringDisable::CLASS, DeclaredClass::Controller);
}

/// `ciborium::Value` under a local name, to read encoded maps in tests.
mod ciborium_value {
    pub(crate) use ciborium::Value;
}
