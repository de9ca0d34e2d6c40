import pytest

from encoderrt.runtime.errors import InputTooLong
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.tokenizer import SEQUENTIAL_TEXTS, TOKENIZER_FILE, TextTokenizer


@pytest.fixture(scope="module")
def bert_tokenizer(tiny_artifacts):
    artifact = tiny_artifacts["bert-cross-encoder"]
    manifest = read_manifest(artifact)
    return TextTokenizer(artifact / TOKENIZER_FILE, 16, manifest.pad_token_id, manifest.inputs)


def test_pairs_put_the_second_text_in_segment_one(bert_tokenizer):
    (encoding,) = bert_tokenizer.encode_pairs(["fox"], ["lazy dog"])
    first_sep = encoding.ids.index(encoding.ids[-1])
    assert set(encoding.type_ids[: first_sep + 1]) == {0}
    assert set(encoding.type_ids[first_sep + 1 :]) == {1}


def test_truncation_cuts_the_document_not_the_query(bert_tokenizer):
    query = "the quick brown fox"
    (alone,) = bert_tokenizer.encode_pairs([query], ["dog"])
    (cut,) = bert_tokenizer.encode_pairs([query], [" ".join(["lazy dog"] * 40)])
    assert len(cut.ids) == 16
    query_part = alone.ids[: alone.type_ids.index(1)]
    assert cut.ids[: len(query_part)] == query_part


def test_overlong_query_falls_back_to_cutting_both(bert_tokenizer):
    long_query = " ".join(["fox"] * 40)
    encodings = bert_tokenizer.encode_pairs([long_query, "fox"], ["dog " * 40, "dog"])
    assert len(encodings[0].ids) == 16 and 1 in encodings[0].type_ids
    assert len(encodings[1].ids) < 16


def test_no_truncation_names_the_item(bert_tokenizer):
    with pytest.raises(InputTooLong) as raised:
        bert_tokenizer.encode(["fox", "fox " * 40], truncate=False)
    assert raised.value.index == 1 and raised.value.limit == 16 and "input 1" in str(raised.value)


def test_padding_uses_the_pad_id(tiny_artifacts):
    artifact = tiny_artifacts["roberta-cross-encoder"]
    manifest = read_manifest(artifact)
    tokenizer = TextTokenizer(artifact / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
    feeds = tokenizer.pad(tokenizer.encode(["a", "the quick brown fox jumps"]))
    assert set(feeds) == {"input_ids", "attention_mask"}
    row = feeds["input_ids"][0]
    assert (row[feeds["attention_mask"][0] == 0] == manifest.pad_token_id).all()


@pytest.mark.parametrize("copies", [1, 5], ids=["one by one", "batched"])  # 4 or 20 pairs: either side of SEQUENTIAL_TEXTS
@pytest.mark.parametrize("name", ["bert-cross-encoder", "roberta-cross-encoder"])
def test_pairs_match_the_hugging_face_tokenizer(name, copies, tiny_models, tiny_artifacts):
    """Pairs are assembled from separately tokenised texts; the result must equal transformers' own pair encoding."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tiny_models[name])
    manifest = read_manifest(tiny_artifacts[name])
    tokenizer = TextTokenizer(tiny_artifacts[name] / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
    firsts = ["where is the amazon", "where is the amazon", "café", "x"] * copies
    seconds = ["the amazon basin", " ".join(["south america"] * 40), "naïve résumé", ""] * copies
    assert (len(firsts) <= SEQUENTIAL_TEXTS) == (copies == 1)
    ours = tokenizer.encode_pairs(firsts, seconds)
    theirs = reference(firsts, seconds, truncation="only_second", max_length=manifest.max_length)
    for i, row in enumerate(ours):
        assert row.ids == theirs["input_ids"][i]
        if "token_type_ids" in theirs:
            assert row.type_ids == theirs["token_type_ids"][i]


@pytest.mark.parametrize("count", [1, SEQUENTIAL_TEXTS, SEQUENTIAL_TEXTS + 1, 3 * SEQUENTIAL_TEXTS])
def test_texts_match_the_hugging_face_tokenizer_one_by_one_and_batched(count, tiny_models, tiny_artifacts):
    """Small requests are tokenised one text at a time, larger ones in one batch call: both as transformers does."""
    from transformers import AutoTokenizer

    name = "roberta-cross-encoder"
    reference = AutoTokenizer.from_pretrained(tiny_models[name])
    manifest = read_manifest(tiny_artifacts[name])
    tokenizer = TextTokenizer(tiny_artifacts[name] / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
    pool = ["where is the amazon", "naïve résumé", "", " ".join(["south america"] * 80), "日本語のテキスト"]
    texts = [pool[i % len(pool)] + f" {i}" for i in range(count)]
    theirs = reference(texts, truncation=True, max_length=manifest.max_length)["input_ids"]
    assert [row.ids for row in tokenizer.encode(texts)] == theirs
    assert tokenizer.count_tokens(texts) == [len(ids) for ids in reference(texts)["input_ids"]]
