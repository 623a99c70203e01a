use super::*;

fn error(text: &str) -> RulesError {
    RulesFile::parse(text).expect_err("must be refused")
}

#[test]
fn a_full_limit_parses_with_every_field() {
    let f = RulesFile::parse(
        r#"
            [[limit]]
            name = "login"
            path = "/login"
            methods = ["post", "Get"]
            key = "ip+header:x-user"
            on_missing_key = "global"
            strategy = "token-bucket"
            quotas = "5/minute; 20/hour"
            burst = 10
            cost = 2
            shadow = true
            "#,
    )
    .unwrap();
    let l = &f.limits[0];
    assert_eq!(l.name, "login");
    assert_eq!(l.methods, vec![Method::POST, Method::GET]);
    assert_eq!(l.key.to_string(), "ip+header:x-user");
    assert_eq!(l.on_missing_key, Some(MissingKey::Global));
    assert_eq!(l.rule.strategy(), Strategy::TokenBucket);
    assert_eq!(l.rule.quotas().len(), 2);
    assert_eq!(l.rule.quotas()[0].burst(), 10);
    assert_eq!((l.cost, l.shadow), (2, true));
    let d = RulesFile::parse("[[limit]]\nname = \"a\"\nquotas = \"1/second\"\n").unwrap();
    let d = &d.limits[0];
    assert_eq!(d.path.as_str(), "/*");
    assert!(d.methods.is_empty());
    assert_eq!(d.key.parts(), &[KeyPart::Ip]);
    assert_eq!(d.rule.strategy(), Strategy::SlidingWindow);
    assert_eq!((d.cost, d.shadow, d.on_missing_key), (1, false, None));
}

#[test]
fn errors_name_their_line_and_column() {
    let e = error("[[limit]]\nname = \"a\"\nquotas = \"5/fortnight\"\n");
    assert_eq!(e.position(), Some((3, 10)), "{e}");
    assert!(
        e.to_string().starts_with("line 3, column 10: quotas:"),
        "{e}"
    );
    let e = error("[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nstrategy = \"nope\"\n");
    assert_eq!(e.position(), Some((4, 12)), "{e}");
    assert!(e.message().contains("unknown strategy"), "{e}");
    let e = error("[[limit]]\nname = \"a\"\nquotas = \"1/second\"\ncolour = 1\n");
    assert_eq!(e.position().map(|p| p.0), Some(4), "{e}");
    assert!(e.message().contains("colour"), "{e}");
    let e = error("[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nkey = \"cookie:sid\"\n");
    assert_eq!(e.position(), Some((4, 7)), "{e}");
    let e = error("[[limit]\n");
    assert_eq!(e.position().map(|p| p.0), Some(1), "{e}");
    let e = error("[[limit]]\nname = \"a\"\nquotas = \"\"\n");
    assert_eq!(e.position(), Some((3, 10)), "empty quotas: {e}");
    let e = error("[[limit]]\nname = \"a\"\n");
    assert!(e.message().contains("quotas"), "{e}");
}

#[test]
fn bad_limits_are_refused_with_a_reason() {
    let two = "[[limit]]\nname = \"a\"\nquotas = \"1/second\"\n";
    let e = error(&format!("{two}{two}"));
    assert!(e.message().contains("duplicate"), "{e}");
    assert_eq!(e.position(), Some((5, 8)));
    for (field, needle) in [
        ("name = \"no spaces\"", "name"),
        ("path = \"login\"", "start with"),
        ("path = \"/a/*/b\"", "final"),
        ("path = \"/a?b=1\"", "never match"),
        ("path = \"/a\\u0000b\"", "NUL"),
        ("path = \"/a b\"", "never match"),
        ("path = \"/a/x{id}\"", "braces"),
        ("path = \"/a/{}\"", "segment"),
        ("methods = [\"\"]", "not a method"),
        ("burst = 3", "burst"),
        ("key = \"ip+ip\"", "twice"),
        (
            "fail_mode = \"shut\"",
            "expected \"open\", \"closed\" or \"local\"",
        ),
        ("fail_mode = 1", "invalid type"),
        ("concurrency = 0", "from 1"),
        ("concurrency = -3", "from 1"),
        ("concurrency = 4294967296", "from 1"),
        ("concurrency = \"2\"", "invalid type"),
        ("window_offset = \"8\"", "window offset"),
        ("window_offset = 8", "string"),
        ("queue_ms = 10", "leaky-bucket"),
        ("queue_ms = -1", "-1"),
        ("settle = \"markers\"", "expected"),
        ("settle = \"header:a b\"", "header name"),
        ("settle = \"trailer:a b\"", "trailer name"),
    ] {
        let text = if field.starts_with("name") {
            format!("[[limit]]\n{field}\nquotas = \"1/second\"\n")
        } else {
            format!("[[limit]]\nname = \"a\"\nquotas = \"1/second\"\n{field}\n")
        };
        let e = error(&text);
        assert!(e.message().contains(needle), "{field}: {e}");
        assert!(e.position().is_some(), "{field}: {e}");
    }
}

/// `fail_mode = "local"` parses for a store with a local fallback (and, store-agnostic, in
/// `RulesFile::parse`); without one it is an error at its value.
#[test]
fn a_local_fail_mode_needs_a_store_with_a_local_fallback() {
    let text = "[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nfail_mode = \"local\"\n\n\
                [[limit]]\nname = \"b\"\nquotas = \"1/second\"\nfail_mode = \"open\"\n";
    let modes =
        |f: RulesFile| -> Vec<Option<FailMode>> { f.limits.iter().map(|l| l.fail_mode).collect() };
    let both = vec![Some(FailMode::Local), Some(FailMode::Open)];
    assert_eq!(modes(RulesFile::parse(text).unwrap()), both);
    assert_eq!(modes(RulesFile::parse_on(text, true).unwrap()), both);
    let e = RulesFile::parse_on(text, false).unwrap_err();
    assert_eq!(e.position(), Some((4, 13)), "{e}");
    assert!(e.to_string().starts_with("line 4, column 13: "), "{e}");
    assert!(
        e.message().contains("--fail-mode local --instances N"),
        "{e}"
    );
    assert!(e.message().contains("local_fallback"), "{e}");
    // Open and closed need no fallback.
    let open = text.replace("\"local\"", "\"closed\"");
    assert!(RulesFile::parse_on(&open, false).is_ok());
}

#[test]
fn window_offsets_and_queues_parse_into_the_rule() {
    let f = RulesFile::parse(
        "[[limit]]\nname = \"day\"\nstrategy = \"fixed-window\"\nquotas = \"100/day\"\n\
             window_offset = \"8h\"\n\n\
             [[limit]]\nname = \"ny\"\nquotas = \"10/hour\"\nwindow_offset = \"-05:00\"\n\n\
             [[limit]]\nname = \"q\"\nstrategy = \"leaky-bucket\"\nquotas = \"2/second\"\n\
             queue_ms = 1000\n",
    )
    .unwrap();
    let offset = |t: &str| t.parse::<WindowOffset>().unwrap();
    assert_eq!(f.limits[0].rule.window_offset(), offset("+08:00"));
    assert_eq!(f.limits[1].rule.window_offset(), offset("-5h"));
    assert_eq!(f.limits[1].rule.strategy(), Strategy::SlidingWindow);
    assert_eq!(f.limits[0].queue, None);
    let q = &f.limits[2];
    assert_eq!(q.queue, Some(std::time::Duration::from_secs(1)));
    assert_eq!(
        q.rule.quotas()[0].burst(),
        3,
        "1000 ms of 500 ms slots: the departure now and two more"
    );
}

#[test]
fn window_offsets_and_queues_that_cannot_work_are_refused_where_they_are_written() {
    let limit = |extra: &str| {
        error(&format!(
            "[[limit]]\nname = \"a\"\nquotas = \"1/second\"\n{extra}\n"
        ))
    };
    let e = limit("strategy = \"token-bucket\"\nwindow_offset = \"+01:00\"");
    assert_eq!(e.position(), Some((5, 17)), "{e}");
    assert!(e.message().contains("clock-aligned"), "{e}");
    let e = limit("window_offset = \"25h\"");
    assert_eq!(e.position(), Some((4, 17)), "{e}");
    assert!(e.message().contains("24 hours"), "{e}");
    let e = limit("queue_ms = 1000");
    assert_eq!(e.position(), Some((4, 12)), "{e}");
    assert!(e.message().contains("leaky-bucket"), "{e}");
    let bucket = "strategy = \"leaky-bucket\"\n";
    for (extra, line, column, needle) in [
        ("queue_ms = 100", 5, 12, "shorter than one interval"),
        ("queue_ms = 2000\nshadow = true", 5, 12, "shadow"),
        ("queue_ms = 2000\nburst = 4", 6, 9, "depth"),
    ] {
        let e = limit(&format!("{bucket}{extra}"));
        assert_eq!(e.position(), Some((line, column)), "{extra}: {e}");
        assert!(e.message().contains(needle), "{extra}: {e}");
    }
    let e = error(
        "[[limit]]\nname = \"a\"\nstrategy = \"leaky-bucket\"\nquotas = \"1/second; 9/minute\"\n\
             queue_ms = 5000\n",
    );
    assert_eq!(e.position(), Some((5, 12)), "{e}");
    assert!(e.message().contains("exactly one"), "{e}");
}

#[test]
fn paths_match_as_the_schema_says() {
    let p = |t: &str| PathPattern::parse(t).unwrap();
    let api = p("/api/*");
    assert!(api.matches("/api/"));
    assert!(api.matches("/api/users/7"));
    assert!(!api.matches("/api"));
    assert!(!api.matches("/apix/1"));
    let all = p("/*");
    assert!(all.matches("/"));
    assert!(all.matches("/anything/at/all"));
    let exact = p("/login");
    assert!(exact.matches("/login"));
    assert!(!exact.matches("/login/"), "no trailing-slash folding");
    assert!(!exact.matches("/Login"), "case-sensitive");
    let param = p("/users/{id}/posts");
    assert!(param.matches("/users/7/posts"));
    assert!(!param.matches("/users//posts"), "a parameter is non-empty");
    assert!(!param.matches("/users/7/posts/1"));
    let root = p("/");
    assert!(root.matches("/"));
    assert!(!root.matches("/a"));
}

#[test]
fn key_specs_display_as_their_text_and_missing_keys_deserialize_by_name() {
    let k = KeySpec::parse_text("ip+header:x-user").unwrap();
    assert_eq!(k.to_string(), "ip+header:x-user");
    assert!(KeySpec::parse_text("cookie:sid").is_err());
    let m: MissingKey = serde_json::from_str("\"global\"").unwrap();
    assert_eq!(m, MissingKey::Global);
}

#[test]
fn an_error_after_multibyte_text_points_at_its_character_column() {
    let e = error("# é\n[[limit]]\nname = \"é\"\nquotas = \"1/second\"\n");
    assert_eq!(e.position(), Some((3, 8)), "{e}");
}

#[test]
fn header_names_may_hold_a_plus_and_composites_split_on_known_parts() {
    let k = KeySpec::parse_text("header:x+y+ip").unwrap();
    assert_eq!(
        k.parts(),
        &[KeyPart::Header(HeaderName::from_static("x+y")), KeyPart::Ip]
    );
    assert!(KeySpec::parse_text("header:").is_err());
    assert!(KeySpec::parse_text("").is_err());
}

#[test]
fn ten_thousand_limits_load_and_an_oversized_file_is_refused() {
    let mut text = String::new();
    for i in 0..10_000 {
        text.push_str(&format!(
            "[[limit]]\nname = \"l{i}\"\npath = \"/p{i}\"\nquotas = \"10/minute\"\n"
        ));
    }
    assert_eq!(RulesFile::parse(&text).unwrap().limits.len(), 10_000);
    let big = "#".repeat(MAX_RULES_FILE_BYTES + 1);
    let e = error(&big);
    assert!(e.message().contains("bytes"), "{e}");
}

#[test]
fn path_patterns_overlap_when_some_path_matches_both() {
    let overlap = |a: &str, b: &str| {
        let (a, b) = (
            PathPattern::parse(a).unwrap(),
            PathPattern::parse(b).unwrap(),
        );
        assert_eq!(a.overlaps(&b), b.overlaps(&a), "{a:?} {b:?}: symmetric");
        a.overlaps(&b)
    };
    for (a, b) in [
        ("/a", "/a"),
        ("/a", "/{x}"),
        ("/a/b", "/a/*"),
        ("/a/*", "/*"),
        ("/a/*", "/{x}/b/*"),
        ("/a/", "/a/*"),
        ("/{x}/b", "/a/{y}"),
    ] {
        assert!(overlap(a, b), "{a} and {b}");
    }
    for (a, b) in [
        ("/a", "/b"),
        ("/a", "/a/*"),
        ("/a/b", "/a"),
        ("/a/*", "/b/*"),
        ("/a//b", "/a/{x}/b"),
        ("/{x}", "/a/b"),
    ] {
        assert!(!overlap(a, b), "{a} and {b}");
    }
}

#[test]
fn two_queues_that_can_apply_to_one_request_are_refused_where_the_second_is_written() {
    let two = |first: &str, second: &str| {
        format!(
            "[[limit]]\nname = \"a\"\nstrategy = \"leaky-bucket\"\nquotas = \"2/second\"\n\
                 {first}\nqueue_ms = 1000\n\n\
                 [[limit]]\nname = \"b\"\nstrategy = \"leaky-bucket\"\nquotas = \"5/second\"\n\
                 {second}\nqueue_ms = 1000\n"
        )
    };
    let e = error(&two("path = \"/api/*\"", "path = \"/api/{v}/upload\""));
    assert_eq!(e.position(), Some((13, 12)), "{e}");
    assert!(e.message().contains("one shaping queue at most"), "{e}");
    let e = error(&two(
        "path = \"/a\"\nmethods = [\"GET\", \"POST\"]",
        "methods = [\"post\"]",
    ));
    assert_eq!(e.position(), Some((14, 12)), "{e}");
    // Disjoint paths or methods, or one of them not a queue: accepted.
    for (first, second) in [
        ("path = \"/a\"", "path = \"/b\""),
        ("path = \"/a\"", "path = \"/a/*\""),
        ("methods = [\"GET\"]", "methods = [\"POST\"]"),
    ] {
        RulesFile::parse(&two(first, second)).unwrap();
    }
    let plain = two("path = \"/a\"", "").replace("queue_ms = 1000\n\n", "\n");
    RulesFile::parse(&plain).unwrap();
}

#[test]
fn a_file_may_have_max_limits_and_a_limit_max_methods_but_no_more() {
    let limits = |n: usize| -> String {
        (0..n)
            .map(|i| {
                format!("[[limit]]\nname = \"l{i}\"\npath = \"/p{i}\"\nquotas = \"5/minute\"\n")
            })
            .collect()
    };
    assert_eq!(
        RulesFile::parse(&limits(MAX_LIMITS)).unwrap().limits.len(),
        MAX_LIMITS
    );
    let e = RulesFile::parse(&limits(MAX_LIMITS + 1)).unwrap_err();
    assert!(e.message().contains("more than 10000 limits"), "{e}");
    assert_eq!(
        e.position(),
        Some((4 * MAX_LIMITS + 2, 8)),
        "at the extra limit's name"
    );

    let methods = |n: usize| -> String {
        let list: Vec<String> = (0..n).map(|i| format!("\"M{i}\"")).collect();
        format!(
            "[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nmethods = [{}]\n",
            list.join(", ")
        )
    };
    assert_eq!(
        RulesFile::parse(&methods(MAX_METHODS)).unwrap().limits[0]
            .methods
            .len(),
        MAX_METHODS
    );
    let e = RulesFile::parse(&methods(MAX_METHODS + 1)).unwrap_err();
    assert!(e.message().contains("more than 16 methods"), "{e}");
    assert_eq!(e.position().map(|(line, _)| line), Some(4));
}
