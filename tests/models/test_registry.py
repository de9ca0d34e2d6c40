import pytest

from encoderrt.models import UnsupportedArchitecture, find_architecture, supported_model_types


def test_families():
    assert find_architecture("bert").uses_token_type_ids
    roberta = find_architecture("xlm-roberta")
    assert roberta.name == "roberta" and roberta.input_names == ("input_ids", "attention_mask")
    assert find_architecture("camembert") is roberta
    assert roberta.max_positions({"max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert find_architecture("mpnet").max_positions({"max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert find_architecture("bert").max_positions({"max_position_embeddings": 512}) == 512
    assert supported_model_types() == ["bert", "camembert", "deberta-v2", "distilbert", "electra",
                                       "embedding_gemma2", "embedding_gemma2_text", "eurobert", "gemma",
                                       "gemma3_text", "gte", "jina_embeddings_v3", "llama", "mistral", "modernbert",
                                       "mpnet", "nomic_bert", "qwen2", "qwen3", "roberta", "t5", "ultrabert",
                                       "xlm-roberta"]
    assert [find_architecture(t).causal for t in ("qwen3", "qwen2", "mistral", "llama", "gemma", "gemma3_text",
                                                  "eurobert")] == [True, True, True, True, True, False, False]


def test_config_aliases_fill_the_bert_names():
    """DistilBERT's config.json says dim / n_layers / n_heads / hidden_dim; compile reads one set of names."""
    config = find_architecture("distilbert").canonical_config({"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072})
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"], config["intermediate_size"]) == (
        768, 6, 12, 3072)
    assert find_architecture("bert").canonical_config({"hidden_size": 384}) == {"hidden_size": 384}


def test_expected_gelus_count_the_head():
    layers = {"num_hidden_layers": 12}
    electra, bert = find_architecture("electra"), find_architecture("bert")
    assert (electra.expected_gelus("score", layers), electra.expected_gelus("embed", layers),
            bert.expected_gelus("score", layers)) == (13, 12, 12)
    # SwiGLU layers gate with SiLU: no GELU but the head's
    eurobert, nomic = find_architecture("eurobert"), find_architecture("nomic_bert")
    assert (eurobert.expected_gelus("score", layers), nomic.expected_gelus("embed", layers),
            nomic.expected_gelus("score", layers)) == (1, 0, 0)
    assert find_architecture("ultrabert").expected_gelus("score", layers) == 0  # its head is the classifier alone
    # decoders: SwiGLU, but Gemma's GeGLU gates with a (tanh) GELU in every layer
    qwen3, gemma = find_architecture("qwen3"), find_architecture("gemma")
    four = {"num_hidden_layers": 4}
    assert (qwen3.expected_gelus("embed", four), gemma.expected_gelus("embed", four)) == (0, 4)
    # T5's count follows the checkpoint: v1.1 gates with GELU, v1.0 has a ReLU feed-forward
    t5 = find_architecture("t5")
    assert [t5.expected_gelus("embed", t5.canonical_config({"num_layers": 6, "feed_forward_proj": proj}))
            for proj in ("gated-gelu", "relu")] == [6, 0]


def test_unknown_family_names_the_supported_ones():
    with pytest.raises(UnsupportedArchitecture, match="model_type 'gpt2'.*bert, camembert, deberta-v2, distilbert, electra, "
                                                      "embedding_gemma2, embedding_gemma2_text, eurobert"):
        find_architecture("gpt2")


def test_family_variants_a_file_cannot_compile_are_named():
    deberta = find_architecture("deberta-v2")
    assert deberta.unsupported({"type_vocab_size": 0}) is None
    assert "type_vocab_size" in deberta.unsupported({"type_vocab_size": 2})
    gte = find_architecture("gte")
    assert gte.unsupported({"type_vocab_size": 0}) is None and gte.unsupported({"type_vocab_size": 1}) is None
    assert "type_vocab_size 2" in gte.unsupported({"type_vocab_size": 2})
    assert find_architecture("bert").unsupported is None
    gemma = find_architecture("gemma")  # a decoder's own refusals come before the shared one (model code of its own)
    assert gemma.unsupported({"use_bidirectional_attention": None}) is None
    assert "use_bidirectional_attention" in gemma.unsupported({"use_bidirectional_attention": True,
                                                                "auto_map": {"AutoModel": "x.Model"}})
    assert "auto_map" in gemma.unsupported({"auto_map": {"AutoModel": "x.Model"}})
    assert "auto_map" in find_architecture("qwen3").unsupported({"auto_map": {"AutoModel": "x.Model"}})
