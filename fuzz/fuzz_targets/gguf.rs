//! The GGUF reader on arbitrary bytes, and everything built from a file that parses: the model
//! config, the tokenizer and the chat template.
#![no_main]

use flashlm::gguf::GgufFile;
use flashlm::model::chat::{ChatMessage, ChatTemplate};
use flashlm::model::config::ModelConfig;
use flashlm::model::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    common::alt_stack();
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for key in &f.metadata_order {
        let _ = f.get_u64(key);
        let _ = f.get_f32(key);
        let _ = f.get_bool(key);
        let _ = f.get_str(key);
        let _ = f.get_str_array(key);
        let _ = f.get_f32_array(key);
        let _ = f.get_i64_array(key);
        if let Ok(Some(a)) = f.get_array(key) {
            let _ = a.get(a.len().saturating_sub(1));
        }
    }
    for t in &f.tensors {
        // Everything the parser vouched for is within the file.
        assert!(t.offset >= f.data_offset);
        assert!(t.offset + t.n_bytes <= f.file_len);
        let bytes = f.read_tensor(t).expect("a parsed tensor is readable");
        assert_eq!(bytes.len() as u64, t.n_bytes);
        assert_eq!(f.try_tensor_data(t).unwrap(), &bytes[..]);
        let v = f.dequantize_tensor(t).unwrap();
        assert_eq!(v.len() as u64, t.n_elements);
        assert!(f.dequantize_row(t, t.n_rows() - 1).unwrap().is_some());
        assert!(f.dequantize_row(t, t.n_rows()).unwrap().is_none());
    }
    let _ = ModelConfig::from_gguf(&f);
    if let Ok(tk) = Tokenizer::from_gguf(&f) {
        let ids = tk.encode("Hello <|im_start|> wörld 🌍 \u{0}\u{7f}", true);
        tk.decode(&ids, false).expect("encoded ids decode");
        let _ = tk.decode(&[0, u32::MAX], true);
    }
    if let Ok(t) = ChatTemplate::from_gguf(&f) {
        let _ = t.render(&[ChatMessage::user("hi")], true);
    }
});
