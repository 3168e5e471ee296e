//! Tokenizer and chat template against the real default model (skipped when it is absent).

mod common;

use flashlm::gguf::GgufFile;
use flashlm::model::chat::{ChatMessage, ChatTemplate};
use flashlm::model::tokenizer::{PreTokenizer, Tokenizer, TokenizerModel};

fn load() -> Option<(GgufFile, Tokenizer)> {
    let path = common::model_path()?;
    let gguf = GgufFile::open(&path).expect("open model");
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer from GGUF");
    Some((gguf, tok))
}

/// A small xorshift generator: deterministic random test strings without extra crates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

fn random_string(rng: &mut Rng) -> String {
    const ASCII: &[&str] = &[
        "a", "b", "e", "t", "Z", "Q", "the", "The", "hello", "World", "x",
    ];
    const DIGITS: &[&str] = &["0", "1", "7", "42", "2024", "3.14", "1,000"];
    const PUNCT: &[&str] = &[
        ".", ",", "!", "?", "'s", "'ll", "n't", "'RE", "\"", "(", ")", "{", "}", "<", ">", "-",
        "_", "=", "+", "*", "/", "\\", "#", "@", "&", "%", "$", "`", "~", "^", "|", ";", ":", "<|",
        "|>", "->", "::", "...",
    ];
    const SPACE: &[&str] = &[
        " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t", "\u{a0}",
        "\u{3000}",
    ];
    const ACCENTS: &[&str] = &["é", "è", "ñ", "ü", "ß", "Ø", "ç", "Ω", "ж", "λ", "ǅ", "ı"];
    const CJK: &[&str] = &[
        "日", "本", "語", "中", "文", "한", "국", "の", "テ", "。", "，",
    ];
    const EMOJI: &[&str] = &["😀", "🌍", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "❤️", "🇫🇷", "🤖", "\u{1F9E0}"];
    const COMBINING: &[&str] = &["\u{301}", "\u{308}", "\u{327}", "\u{20DD}", "\u{200D}"];
    let mut s = String::new();
    let n = rng.below(30);
    for _ in 0..n {
        let class = match rng.below(8) {
            0 | 1 => ASCII,
            2 => DIGITS,
            3 => PUNCT,
            4 => SPACE,
            5 => ACCENTS,
            6 => {
                if rng.below(2) == 0 {
                    CJK
                } else {
                    EMOJI
                }
            }
            _ => COMBINING,
        };
        s.push_str(rng.pick(class));
    }
    s
}

#[test]
fn metadata() {
    let Some((_, t)) = load() else { return };
    assert_eq!(t.model(), TokenizerModel::Bpe);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::DigitsThenGpt2);
    assert_eq!(t.n_vocab(), 49152);
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.eos_id(), Some(2));
    assert_eq!(t.unk_id(), Some(0));
    assert_eq!(t.pad_id(), Some(2));
    assert!(!t.add_bos());
    assert!(t.is_end_of_generation(2)); // <|im_end|>, the EOS
    assert!(t.is_end_of_generation(0)); // <|endoftext|>
    assert!(!t.is_end_of_generation(1)); // <|im_start|>
    assert!(!t.is_end_of_generation(504));
}

#[test]
fn capital_of_france() {
    let Some((_, t)) = load() else { return };
    let ids = t.encode("The capital of France is", true);
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
    assert_eq!(t.decode(&ids, false).unwrap(), "The capital of France is");
}

/// Ids from the Hugging Face `tokenizers` library: a BPE over this model's vocabulary and merges
/// (dumped from the GGUF with the `gguf` Python package), with the pre-tokenizer sequence
/// `Digits(individual_digits=True)`, `ByteLevel(add_prefix_space=False, use_regex=True)`.
const GOLDEN: &[(&str, &[u32])] = &[
    (
        "I'm sure they'll say we've done it, didn't we? You're right, it's John's. I'D LOVE IT'S",
        &[
            57, 5248, 2090, 502, 3060, 1643, 392, 3543, 2294, 357, 28, 3683, 982, 392, 47, 1206,
            2316, 1048, 28, 357, 506, 2322, 506, 30, 339, 23, 52, 16887, 18525, 9627, 23, 67,
        ],
    ),
    (
        "The year 2024 had 365 days; π≈3.14159 and 1,000,000 people.",
        &[
            504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 37, 2009, 43, 25143, 40533, 226, 35,
            30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 701, 30,
        ],
    ),
    (
        "Hello    world  \t tabs\tand   spaces   ",
        &[19556, 333, 905, 256, 197, 29416, 197, 397, 256, 5600, 333],
    ),
    (
        "line one\n\nline two\r\n\tindented\n   \n",
        &[
            1311, 582, 198, 198, 1311, 827, 2738, 197, 526, 6574, 472, 198,
        ],
    ),
    (
        "Café naïve résumé — “quotes” ‘single’ … ñ ü ß",
        &[
            51, 1939, 2756, 15486, 46494, 412, 2756, 5422, 2756, 1841, 619, 385, 2346, 573, 1551,
            18536, 417, 5548, 5549, 126, 5549, 137, 5549, 249,
        ],
    ),
    (
        "日本語のテキストと中文文本，한국어 텍스트。",
        &[
            23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100,
            226, 7365, 118, 28589, 29184, 29184, 40993, 12831, 33085, 246, 181, 130, 251, 183, 240,
            129, 48138, 223, 231, 183, 228, 114, 184, 228, 133, 19076,
        ],
    ),
    (
        "Emoji: 👋🌍🚀 👨‍👩‍👧‍👦 ❤️ 🇫🇷",
        &[
            10809, 33777, 42, 15107, 235, 229, 10813, 230, 231, 10813, 244, 218, 15107, 235, 118,
            321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813, 235, 116, 4636,
            247, 114, 31752, 15107, 225, 121, 10813, 225, 132,
        ],
    ),
    (
        "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n",
        &[
            7853, 1085, 1000, 1662, 472, 1303, 1792, 42, 717, 1159, 44, 101, 35, 34, 46, 446,
            37024, 21653, 33, 28, 216, 34, 28, 216, 35, 26695, 472, 1628, 34115, 17, 45257, 42, 47,
            29394, 1792, 4258, 198, 109, 198,
        ],
    ),
    (
        "def f(a, b):\n\treturn a**2 + b // 3  # comment\n",
        &[
            1604, 275, 24, 81, 28, 278, 727, 198, 197, 5406, 253, 828, 34, 1232, 278, 13241, 216,
            35, 216, 907, 5189, 198,
        ],
    ),
    ("  leading and trailing  ", &[216, 2899, 284, 35079, 256]),
    (
        "e\u{301}\u{302}a\u{308} combining marks; Ελληνικά Русский عربي हिन्दी",
        &[
            85, 151, 219, 151, 220, 81, 151, 226, 9301, 8029, 43, 5664, 239, 17162, 17162, 25723,
            11517, 12001, 21118, 26112, 5470, 250, 14714, 9382, 39511, 7872, 24958, 45704, 20602,
            31462, 23339, 12335, 134, 27011, 30658, 16525, 44757, 37189,
        ],
    ),
    (
        "12345 00042 3.0e-10 0x1F ٣٤ ²½",
        &[
            33, 34, 35, 36, 37, 216, 32, 32, 32, 36, 34, 216, 35, 30, 32, 85, 29, 33, 32, 216, 32,
            104, 33, 54, 216, 164, 113, 164, 114, 216, 19133, 16738,
        ],
    ),
];

#[test]
fn golden_ids() {
    let Some((_, t)) = load() else { return };
    for (text, want) in GOLDEN {
        assert_eq!(&t.encode(text, false), want, "{text:?}");
        assert_eq!(&t.encode(text, true), want, "{text:?}");
        assert_eq!(t.decode(want, false).unwrap(), *text);
    }
}

#[test]
fn round_trip() {
    let Some((_, t)) = load() else { return };
    let edge = [
        "",
        " ",
        "    ",
        "\n\n\n",
        "\t",
        "  leading",
        "trailing  ",
        "12345",
        "a\r\nb",
        "\u{301}",
        "🤖",
        "<|im_start|>",
        "x\u{0}y",
    ];
    for s in edge {
        let ids = t.encode(s, false);
        assert_eq!(t.decode(&ids, false).unwrap(), s, "{s:?} -> {ids:?}");
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..2000 {
        let s = random_string(&mut rng);
        let ids = t.encode(&s, false);
        assert_eq!(t.decode(&ids, false).unwrap(), s, "{s:?} -> {ids:?}");
        assert_eq!(t.decode(&ids, true).unwrap(), s, "{s:?} -> {ids:?}");
    }
}

#[test]
fn special_tokens() {
    let Some((_, t)) = load() else { return };
    let text = "<|im_start|>user\nHi<|im_end|>";
    let ids = t.encode(text, true);
    assert_eq!(ids, [1, 4093, 198, 26843, 2]);
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    assert_eq!(t.decode(&ids, true).unwrap(), "user\nHi");
    // Without parse_special the markers are ordinary text.
    let ids = t.encode(text, false);
    assert_eq!(
        ids,
        [
            44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306, 79, 486, 108, 46
        ]
    );
    assert!(!ids.contains(&1) && !ids.contains(&2));
    assert_eq!(t.decode(&ids, true).unwrap(), text);
}

#[test]
fn stream_decoder_matches_decode() {
    let Some((_, t)) = load() else { return };
    let text = "日本語のテキスト 👨‍👩‍👧‍👦 café — done";
    let ids = t.encode(text, false);
    // Some tokens carry only part of a character.
    assert!(
        ids.iter()
            .any(|&id| std::str::from_utf8(&t.token_bytes(id).unwrap()).is_err())
    );
    let mut d = t.stream_decoder(false);
    let mut out = String::new();
    for &id in &ids {
        let part = d.push(id).unwrap();
        assert!(!part.contains('\u{FFFD}'), "{part:?}");
        out.push_str(&part);
    }
    out.push_str(&d.finish());
    assert_eq!(out, t.decode(&ids, false).unwrap());
    assert_eq!(out, text);
    assert!(d.push(t.n_vocab() as u32).is_err());
    assert!(t.decode(&[u32::MAX], false).is_err());
}

#[test]
fn encode_is_fast() {
    let Some((_, t)) = load() else { return };
    let text =
        "The quick brown fox jumps over the lazy dog, 12 times; café, naïve, 日本語.\n".repeat(60);
    let start = std::time::Instant::now();
    let ids = t.encode(&text, false);
    let elapsed = start.elapsed();
    eprintln!(
        "{} bytes -> {} tokens in {elapsed:?}",
        text.len(),
        ids.len()
    );
    // Generous bound for debug builds on a busy machine.
    assert!(elapsed.as_millis() < 500, "{elapsed:?}");
    assert_eq!(t.decode(&ids, false).unwrap(), text);
}

#[test]
fn chat_template_from_model() {
    let Some((gguf, t)) = load() else { return };
    let chat = ChatTemplate::from_gguf(&gguf).expect("chat template");
    assert_eq!(chat.bos_token(), "<|im_start|>");
    assert_eq!(chat.eos_token(), "<|im_end|>");
    let prompt = chat.render(&[ChatMessage::user("Hi")], true).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = t.encode(&prompt, true);
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
    assert_eq!(t.decode(&ids, false).unwrap(), prompt);

    let conversation = [
        ChatMessage::system("You are terse."),
        ChatMessage::user("What is 2+2?"),
        ChatMessage::assistant("4."),
        ChatMessage::user("And 3+3?"),
    ];
    let prompt = chat.render(&conversation, true).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let prompt = chat.render(&conversation[1..3], false).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4.<|im_end|>\n"
    );
}
