"""Tiny random checkpoints for tests: real transformers configs and trained tokenizers, no downloads.

Weights use a large initializer range so that outputs differ clearly between inputs; with the
default 0.02 every input gives nearly the same vector and a comparison would prove nothing.
"""

from __future__ import annotations

from pathlib import Path

CORPUS_WORDS = (
    "the quick brown fox jumps over a lazy dog where is amazon rainforest basin south america nations "
    "search query document passage rank score model text encoder retrieval über schnelle braune fuchs "
    "springt hund größe regenwald café naïve résumé 東京 日本 首都 привет как дела мир"
).split()


def _corpus() -> list[str]:
    words = list(CORPUS_WORDS)
    return [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 3


def _wordpiece_tokenizer(max_length: int):
    """WordPiece over a fixed vocabulary (characters, continuation pieces, whole words).

    The tokenizers WordPiece trainer breaks ties in hash order, so a trained vocabulary (and
    with it every test figure) would change from run to run; an explicit one does not.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer = normalizers.BertNormalizer(lowercase=True)
    words = sorted({w for text in _corpus() for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(normalizer.normalize_str(text))})
    chars = sorted({c for w in words for c in w})
    vocab = special + chars + [f"##{c}" for c in chars] + [w for w in words if len(w) > 1]
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return BertTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_length,
    )


def _byte_level_tokenizer(max_length: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import RobertaTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus(), trainer)
    return RobertaTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=max_length,
    )


def _small(**overrides):
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, initializer_range=0.3)
    base.update(overrides)
    return base


def bert_checkpoint(folder: Path, num_labels: int | None, max_positions: int = 64, seed: int = 0, **sizes) -> Path:
    """A BERT encoder (num_labels None) or sequence classifier with a WordPiece tokenizer; `sizes` override _small's."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    tokenizer = _wordpiece_tokenizer(max_positions)
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=max_positions, **_small(**sizes),
                        **({"num_labels": num_labels} if num_labels else {}))
    model = BertForSequenceClassification(config) if num_labels else BertModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def roberta_checkpoint(folder: Path, num_labels: int | None, max_positions: int = 66, model_type: str = "roberta", seed: int = 0) -> Path:
    """A RoBERTa (or XLM-RoBERTa) encoder or classifier; positions start at padding_idx + 1."""
    import torch
    from transformers import (RobertaConfig, RobertaForSequenceClassification, RobertaModel, XLMRobertaConfig,
                              XLMRobertaForSequenceClassification, XLMRobertaModel)

    torch.manual_seed(seed)
    tokenizer = _byte_level_tokenizer(max_positions - 2)
    config_class, head, bare = (
        (RobertaConfig, RobertaForSequenceClassification, RobertaModel) if model_type == "roberta"
        else (XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel)
    )
    config = config_class(vocab_size=len(tokenizer), max_position_embeddings=max_positions, pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=0, eos_token_id=2, type_vocab_size=1, **_small(),
                          **({"num_labels": num_labels} if num_labels else {}))
    model = head(config) if num_labels else bare(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sentence_transformers_folder(folder: Path, pooling: str, normalize: bool = False, max_seq_length: int = 48) -> Path:
    """A sentence-transformers model folder saved by sentence-transformers itself."""
    from sentence_transformers import SentenceTransformer, models

    encoder = bert_checkpoint(folder.with_name(folder.name + "-encoder"), num_labels=None)
    modules = [models.Transformer(str(encoder), max_seq_length=max_seq_length), models.Pooling(32, pooling)]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder
