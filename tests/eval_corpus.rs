//! The shipped evaluation text: plain prose of the right size, long enough for perplexity over
//! several 4,096-token chunks with the default model (that part is skipped when it is absent).

mod common;

use flashlm::eval;
use flashlm::gguf::GgufFile;
use flashlm::model::tokenizer::Tokenizer;

const TEXT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/persuasion.txt");

fn text() -> String {
    let bytes = std::fs::read(TEXT).expect("read data/persuasion.txt");
    assert!(
        (150_000..1_000_000).contains(&bytes.len()),
        "{} bytes",
        bytes.len()
    );
    String::from_utf8(bytes).expect("the text is UTF-8")
}

#[test]
fn text_is_plain_prose_without_distribution_boilerplate() {
    let t = text();
    assert!(t.starts_with("Persuasion\n"), "{:?}", &t[..40]);
    assert!(t.trim_end().ends_with("Finis"));
    assert!(!t.contains('\r'));
    let lower = t.to_lowercase();
    for marker in ["gutenberg", "ebook", "*** start of", "*** end of", "www."] {
        assert!(!lower.contains(marker), "found {marker:?}");
    }
    // Prose: mostly letters and spaces, many sentences, the opening line of chapter 1.
    let letters = t.chars().filter(|c| c.is_alphabetic()).count();
    assert!(letters * 100 > t.len() * 75, "{letters} letters");
    assert!(t.matches(". ").count() > 2_000);
    assert!(t.contains("Sir Walter Elliot, of Kellynch Hall, in Somersetshire"));
}

#[test]
fn text_holds_many_chunks_of_4096_tokens() {
    let Some(path) = common::model_path() else {
        return;
    };
    let gguf = GgufFile::open(&path).expect("open model");
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let tokens = tok.encode(&text(), false);
    assert!(tokens.len() >= 40_000, "{} tokens", tokens.len());
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    let chunks = eval::chunks(&tokens, 4096, None, bos).expect("chunks");
    assert_eq!(chunks.len(), tokens.len() / 4096);
    assert!(chunks.len() >= 9, "{} chunks", chunks.len());
    let limited = eval::chunks(&tokens, 4096, Some(3), bos).expect("chunks");
    assert_eq!(limited.len(), 3);
    assert_eq!(limited[..], chunks[..3]);
    println!("{} tokens, {} chunks of 4096", tokens.len(), chunks.len());
}
