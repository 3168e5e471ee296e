use super::*;

fn chat(body: &str) -> Result<ChatRequest, ApiError> {
    parse_chat(body.as_bytes(), 100)
}

fn completion(body: &str) -> Result<CompletionRequest, ApiError> {
    parse_completion(body.as_bytes(), 100)
}

fn param_of(r: Result<impl std::fmt::Debug, ApiError>) -> Option<String> {
    let e = r.expect_err("should be refused");
    assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{e:?}");
    assert_eq!(e.kind, "invalid_request_error");
    e.param
}

#[test]
fn a_full_chat_request_parses() {
    let r = chat(
        r#"{"model": "m", "messages": [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
            "max_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3, "seed": -1,
            "stop": ["a", "b"], "stream": true, "stream_options": {"include_usage": true}, "n": 1}"#,
    )
    .unwrap();
    assert_eq!(r.messages.len(), 2);
    assert_eq!(r.messages[1].content, "hi there");
    assert_eq!(r.messages[0].role, "system");
    let c = r.common;
    assert_eq!(c.max_tokens, Some(7));
    assert_eq!(c.sampling.temperature, 0.0);
    assert_eq!(c.sampling.top_p, 0.5);
    assert_eq!(c.sampling.top_k, 3);
    assert_eq!(c.sampling.seed, u64::MAX);
    assert_eq!(c.stop, vec!["a".to_string(), "b".to_string()]);
    assert!(c.stream && c.include_usage);
}

#[test]
fn defaults_follow_openai() {
    let c = completion(r#"{"prompt": "x"}"#).unwrap().common;
    assert_eq!(c.max_tokens, None);
    assert_eq!(c.sampling.temperature, 1.0);
    assert_eq!(c.sampling.top_p, 1.0);
    assert_eq!(c.sampling.top_k, 0);
    assert!(!c.stream && c.stop.is_empty());
    // Unseeded requests get different seeds.
    let d = completion(r#"{"prompt": "x", "seed": null}"#)
        .unwrap()
        .common;
    assert_ne!(c.sampling.seed, d.sampling.seed);
}

#[test]
fn prompts_of_every_accepted_shape() {
    let p = |b: &str| completion(b).unwrap().prompt;
    assert_eq!(p(r#"{"prompt": "a"}"#), Prompt::Text("a".into()));
    assert_eq!(p(r#"{"prompt": ["a"]}"#), Prompt::Text("a".into()));
    assert_eq!(p(r#"{"prompt": [1, 2]}"#), Prompt::Tokens(vec![1, 2]));
    assert_eq!(p(r#"{"prompt": [[3]]}"#), Prompt::Tokens(vec![3]));
    let e = completion(r#"{"prompt": ["a", "b"]}"#).unwrap_err();
    assert!(e.message.contains("one prompt"), "{}", e.message);
    assert_eq!(
        param_of(completion(r#"{"prompt": [1, -2]}"#)),
        Some("prompt".into())
    );
    assert_eq!(
        param_of(completion(r#"{"prompt": [4294967296]}"#)),
        Some("prompt".into())
    );
    assert_eq!(
        param_of(completion(r#"{"prompt": 5}"#)),
        Some("prompt".into())
    );
    assert_eq!(param_of(completion(r#"{}"#)), Some("prompt".into()));
}

#[test]
fn malformed_bodies_are_refused() {
    for body in [&b"{"[..], b"[]", b"\"x\"", b"", b"{\"prompt\": \"a\",}"] {
        let e = parse_completion(body, 10).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    }
    let e = parse_completion(b"{\"prompt\": \"\xff\xfe\"}", 10).unwrap_err();
    assert!(e.message.contains("UTF-8"), "{}", e.message);
}

#[test]
fn unknown_fields_are_named() {
    assert_eq!(
        param_of(completion(r#"{"prompt": "a", "best_of": 2}"#)),
        Some("best_of".into())
    );
    assert_eq!(
        param_of(chat(
            r#"{"messages": [{"role": "user", "content": "a", "x": 1}]}"#
        )),
        Some("messages[0].x".into())
    );
    assert_eq!(
        param_of(chat(
            r#"{"messages": [{"role": "user", "content": "a"}], "prompt": "a"}"#
        )),
        Some("prompt".into())
    );
    assert_eq!(
        param_of(completion(
            r#"{"prompt": "a", "stream_options": {"x": true}}"#
        )),
        Some("stream_options.x".into())
    );
}

#[test]
fn out_of_range_and_wrong_types_are_refused() {
    for (field, value) in [
        ("max_tokens", "-1"),
        ("max_tokens", "0"),
        ("max_tokens", "101"),
        ("max_tokens", "1e30"),
        ("max_tokens", "2.5"),
        ("max_tokens", "\"5\""),
        ("max_completion_tokens", "99999999999999999999"),
        ("temperature", "-0.1"),
        ("temperature", "2.5"),
        ("temperature", "\"hot\""),
        ("top_p", "0"),
        ("top_p", "1.01"),
        ("top_p", "-1"),
        ("top_k", "-1"),
        ("top_k", "1.5"),
        ("seed", "1.5"),
        ("seed", "\"7\""),
        ("n", "2"),
        ("n", "0"),
        ("stop", "5"),
        ("stop", "[\"a\", \"b\", \"c\", \"d\", \"e\"]"),
        ("stop", "[\"\"]"),
        ("stop", "[1]"),
        ("stream", "\"yes\""),
        ("stream", "1"),
        ("model", "3"),
    ] {
        let body = format!(r#"{{"prompt": "a", "{field}": {value}}}"#);
        assert_eq!(
            param_of(completion(&body)),
            Some(field.to_string()),
            "{body}"
        );
    }
    // Both token limits must agree.
    assert!(completion(r#"{"prompt": "a", "max_tokens": 3, "max_completion_tokens": 4}"#).is_err());
    let c = completion(r#"{"prompt": "a", "max_tokens": 3, "max_completion_tokens": 3}"#).unwrap();
    assert_eq!(c.common.max_tokens, Some(3));
}

#[test]
fn messages_are_checked() {
    for (body, param) in [
        (r#"{"messages": []}"#, "messages"),
        (r#"{"messages": "hi"}"#, "messages"),
        (r#"{"messages": [5]}"#, "messages[0]"),
        (
            r#"{"messages": [{"role": "wizard", "content": "a"}]}"#,
            "messages[0].role",
        ),
        (r#"{"messages": [{"content": "a"}]}"#, "messages[0].role"),
        (r#"{"messages": [{"role": "user"}]}"#, "messages[0].content"),
        (
            r#"{"messages": [{"role": "user", "content": 3}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            "messages[0].content[0]",
        ),
    ] {
        assert_eq!(param_of(chat(body)), Some(param.to_string()), "{body}");
    }
    let r = chat(r#"{"messages": [{"role": "developer", "content": "x"}, {"role": "assistant", "content": null}]}"#)
        .unwrap();
    assert_eq!(r.messages[0].role, "system");
    assert_eq!(r.messages[1].content, "");
}
