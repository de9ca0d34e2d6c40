"""Tiny random checkpoints for tests: real transformers configs and trained tokenizers, no downloads.

Weights use a large initializer range so that outputs differ clearly between inputs; with the
default 0.02 every input gives nearly the same vector and a comparison would prove nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS_WORDS = (
    "the quick brown fox jumps over a lazy dog where is amazon rainforest basin south america nations "
    "search query document passage rank score model text encoder retrieval über schnelle braune fuchs "
    "springt hund größe regenwald café naïve résumé 東京 日本 首都 привет как дела мир"
).split()


PAIRS = [
    ("where is the amazon rainforest", "the amazon rainforest covers much of the amazon basin of south america"),
    ("where is the amazon rainforest", "der schnelle braune fuchs springt über den hund"),
    ("café", "résumé naïve café"),
    ("东京", "东京 日本 首都"),
    ("the quick brown fox", " ".join(["fox jumps over the lazy dog"] * 30)),  # the document must be truncated
]
"""(query, document) pairs in the tiny tokenizers' corpus: non-ASCII, unknown characters, truncation."""


def _corpus() -> list[str]:
    words = list(CORPUS_WORDS)
    return [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 3


_BERT_SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
_ROBERTA_SPECIAL = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>", "mask_token": "<mask>",
                    "cls_token": "<s>", "sep_token": "</s>"}
"""In vocabulary order: <s> 0, <pad> 1, </s> 2, as RoBERTa, CamemBERT and MPNet number them."""


def _special_vocab(special: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(special.values()))


def _wordpiece_tokenizer(max_length: int, wrapper: str = "BertTokenizerFast", special: dict[str, str] = _BERT_SPECIAL,
                         extra: tuple[str, ...] = ()):
    """WordPiece over a fixed vocabulary (characters, continuation pieces, whole words), BERT's [CLS] A [SEP] B [SEP]
    or, with RoBERTa's special tokens (MPNet), <s> A </s></s> B </s>; `extra` tokens at the end of the vocabulary.

    The tokenizers WordPiece trainer breaks ties in hash order, so a trained vocabulary (and
    with it every test figure) would change from run to run; an explicit one does not.
    """
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True)
    words = sorted({w for text in _corpus() for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(normalizer.normalize_str(text))})
    chars = sorted({c for w in words for c in w})
    vocab = _special_vocab(special) + chars + [f"##{c}" for c in chars] + [w for w in words if len(w) > 1] + list(extra)
    ids = {token: i for i, token in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token=special["unk_token"]))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = special["cls_token"], special["sep_token"]
    processor = processors.BertProcessing if special is _BERT_SPECIAL else processors.RobertaProcessing
    tokenizer.post_processor = processor((sep, ids[sep]), (cls, ids[cls]))
    return getattr(transformers, wrapper)(tokenizer_object=tokenizer, model_max_length=max_length, **special)


def _unigram_tokenizer(max_length: int, wrapper: str = "CamembertTokenizerFast", special: dict[str, str] = _ROBERTA_SPECIAL):
    """A trained SentencePiece-style Unigram model: CamemBERT's <s> A </s></s> B </s>, or with BERT's special tokens
    DeBERTa-v2's [CLS] A [SEP] B [SEP]."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    vocab = _special_vocab(special)
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=vocab, unk_token=special["unk_token"])
    tokenizer.train_from_iterator(_corpus(), trainer)
    cls, sep = special["cls_token"], special["sep_token"]
    processor = processors.BertProcessing if special is _BERT_SPECIAL else processors.RobertaProcessing
    tokenizer.post_processor = processor((sep, vocab.index(sep)), (cls, vocab.index(cls)))
    return getattr(transformers, wrapper)(tokenizer_object=tokenizer, model_max_length=max_length, **special)


_T5_SPECIAL = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
"""In vocabulary order: <pad> 0, </s> 1, <unk> 2, as T5 numbers them."""


def _t5_tokenizer(max_length: int):
    """A trained SentencePiece-style Unigram model with T5's rule: no start token, </s> after each text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast

    vocab = _special_vocab(_T5_SPECIAL)
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=vocab, unk_token="<unk>")
    tokenizer.train_from_iterator(_corpus(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B:1 </s>:1",
                                                             special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length, extra_ids=0, **_T5_SPECIAL)


def _byte_level_tokenizer(max_length: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
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


DECODER_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _decoder_tokenizer(max_length: int, append_eos: bool = True, padding_side: str = "left", answers: bool = True):
    """Qwen's kind: byte-level BPE whose pad is its end-of-text token, which Qwen3-Embedding's post-processor appends
    to every text (`append_eos`); padded on the left, as Qwen3's tokenizers are, unless told otherwise; with "yes" and
    "no" as tokens of their own (`answers`), which causal-LM rerankers are scored by."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import Qwen2TokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(DECODER_SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus() + (["yes", "no"] * 200 if answers else []), trainer)
    if append_eos:
        eos = DECODER_SPECIAL[0]
        tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A {eos} $B:1 {eos}:1",
                                                                 special_tokens=[(eos, 0)])
    return Qwen2TokenizerFast(tokenizer_object=tokenizer, eos_token=DECODER_SPECIAL[0], pad_token=DECODER_SPECIAL[0],
                              unk_token=None, bos_token=None, model_max_length=max_length, padding_side=padding_side)


def _small(**overrides):
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, initializer_range=0.3)
    base.update(overrides)
    return base


def bert_checkpoint(folder: Path, num_labels: int | None, max_positions: int = 64, seed: int = 0,
                    extra_tokens: tuple[str, ...] = (), vocab_rows: int | None = None, **sizes) -> Path:
    """A BERT encoder (num_labels None) or sequence classifier with a WordPiece tokenizer; `sizes` override _small's.

    `vocab_rows`: an embedding table longer than the tokenizer's vocabulary, as checkpoints pad theirs (Qwen3's
    151,936 rows for 151,669 tokens): bytes that cost no compute, for a large file in a quick test."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    tokenizer = _wordpiece_tokenizer(max_positions, extra=extra_tokens)
    config = BertConfig(vocab_size=vocab_rows or tokenizer.vocab_size, max_position_embeddings=max_positions,
                        **_small(**sizes),
                        **({"num_labels": num_labels} if num_labels else {}))
    model = BertForSequenceClassification(config) if num_labels else BertModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def roberta_checkpoint(folder: Path, num_labels: int | None, max_positions: int = 66, model_type: str = "roberta", seed: int = 0) -> Path:
    """A RoBERTa (or XLM-RoBERTa) encoder or classifier; positions start at padding_idx + 1."""
    import torch
    from transformers import (
        RobertaConfig,
        RobertaForSequenceClassification,
        RobertaModel,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
        XLMRobertaModel,
    )

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


_DECODER_CONFIGS = {"qwen3": "Qwen3Config", "qwen2": "Qwen2Config", "mistral": "MistralConfig", "llama": "LlamaConfig",
                    "gemma": "GemmaConfig"}


def _decoder_config(family: str, tokenizer, small: dict, **extra):
    """A decoder's config from _small's sizes (`head_dim` among them, else hidden / heads), half as many KV heads as
    query heads, and the tokenizer's padding and end ids."""
    import transformers

    sizes = dict(small)
    head_dim = sizes.pop("head_dim", sizes["hidden_size"] // sizes["num_attention_heads"])
    return getattr(transformers, _DECODER_CONFIGS[family])(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        num_key_value_heads=sizes["num_attention_heads"] // 2, head_dim=head_dim, **extra, **sizes)


def family_checkpoint(folder: Path, family: str, num_labels: int | None, seed: int = 0, max_positions: int = 64,
                      initializer_range: float = 0.3, decoder_tokenizer: dict | None = None, **sizes) -> Path:
    """An encoder or sequence classifier of a family beyond BERT/RoBERTa, each with its own kind of tokenizer;
    `sizes` override _small's (a base-sized one for benchmarks); `decoder_tokenizer`: _decoder_tokenizer's options.

    ELECTRA gets an embedding size below the hidden size, so its embedding projection is exercised.
    """
    import torch
    import transformers
    from transformers import AutoModel, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    small = _small(initializer_range=initializer_range, **sizes)
    if family == "distilbert":
        tokenizer = _wordpiece_tokenizer(max_positions, "DistilBertTokenizerFast")
        config = transformers.DistilBertConfig(dim=small["hidden_size"], n_layers=small["num_hidden_layers"],
                                               n_heads=small["num_attention_heads"], hidden_dim=small["intermediate_size"],
                                               initializer_range=initializer_range)
    elif family == "electra":
        tokenizer = _wordpiece_tokenizer(max_positions, "ElectraTokenizerFast")
        config = transformers.ElectraConfig(embedding_size=16, **small)
    elif family == "mpnet":
        tokenizer = _wordpiece_tokenizer(max_positions - 2, "MPNetTokenizerFast", {**_ROBERTA_SPECIAL, "unk_token": "[UNK]"})
        config = transformers.MPNetConfig(pad_token_id=1, **small)
    elif family == "camembert":
        tokenizer = _unigram_tokenizer(max_positions - 2)
        config = transformers.CamembertConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, **small)
    elif family == "deberta-v2":  # v3's layout: relative attention with both position terms, no segment embeddings
        tokenizer = _unigram_tokenizer(max_positions, "DebertaV2TokenizerFast", _BERT_SPECIAL)
        config = transformers.DebertaV2Config(pad_token_id=0, type_vocab_size=0, relative_attention=True,
                                              position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm",
                                              pos_att_type=["p2c", "c2p"], position_biased_input=False, share_att_key=True,
                                              **small)
    elif family == "modernbert":  # a 16-token window, so that parity covers sequences past it
        tokenizer = _byte_level_tokenizer(max_positions)
        config = transformers.ModernBertConfig(pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2,
                                               cls_token_id=0, sep_token_id=2,
                                               local_attention=small.pop("local_attention", 16),
                                               global_attn_every_n_layers=2, **small)
    elif family == "xlm-roberta":  # bge-m3's layout when given its 8,194 positions
        tokenizer = _unigram_tokenizer(max_positions - 2, "XLMRobertaTokenizerFast")
        config = transformers.XLMRobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, **small)
    elif family == "nomic_bert":  # rotary, SwiGLU, no biases; BERT's WordPiece and segment embeddings
        tokenizer = _wordpiece_tokenizer(max_positions)
        config = transformers.NomicBertConfig(pad_token_id=0, **small)
    elif family == "gte":  # rotary, GeGLU; XLM-R's tokenizer and padding id
        tokenizer = _unigram_tokenizer(max_positions)
        config = transformers.GteConfig(pad_token_id=1, type_vocab_size=1, **small)
    elif family == "eurobert":  # Llama-style: RMSNorm, rotary, SwiGLU, grouped-query attention
        tokenizer = _byte_level_tokenizer(max_positions)
        config = transformers.EuroBertConfig(pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2,
                                             num_key_value_heads=small["num_attention_heads"] // 2, **small)
    elif family == "ultrabert":  # EuroBERT's layers, windowed (8 tokens each side) but for each `global_every`-th
        tokenizer = _byte_level_tokenizer(max_positions)
        every = small.pop("global_every", 2)
        config = transformers.UltrabertConfig(
            pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2,
            num_key_value_heads=small["num_attention_heads"] // 2, sliding_window=small.pop("sliding_window", 8),
            layer_types=["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                         for i in range(small["num_hidden_layers"])], **small)
    elif family == "jina_embeddings_v3":  # XLM-R's tokenizer, rotary, post-norm; its task adapters: task_adapters
        tokenizer = _unigram_tokenizer(max_positions, "XLMRobertaTokenizerFast")
        config = transformers.JinaEmbeddingsV3Config(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1,
                                                     **small)
    elif family == "gemma3":  # EmbeddingGemma's: bidirectional, a global layer after each 16-token windowed one
        tokenizer = _byte_level_tokenizer(max_positions)
        head_dim = small["hidden_size"] // small["num_attention_heads"]
        config = transformers.Gemma3TextConfig(pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2,
                                               use_bidirectional_attention=True, sliding_window=16, head_dim=head_dim,
                                               layer_types=["sliding_attention", "full_attention"]
                                               * (small["num_hidden_layers"] // 2),
                                               num_key_value_heads=small["num_attention_heads"] // 2,
                                               query_pre_attn_scalar=head_dim, **small)
    elif family == "embedding_gemma2":  # EmbeddingGemma 2's text tower: an 8-token window each side, wider global heads
        tokenizer = _byte_level_tokenizer(max_positions)
        head_dim = small.pop("head_dim", small["hidden_size"] // small["num_attention_heads"])
        config = transformers.EmbeddingGemma2TextConfig(
            pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2, head_dim=head_dim,
            sliding_window=small.pop("sliding_window", 8),
            sliding_window_pattern=small.pop("sliding_window_pattern", 2),
            global_head_dim=small.pop("global_head_dim", 2 * head_dim), num_global_key_value_heads=1,
            num_key_value_heads=small["num_attention_heads"] // 2,
            hidden_size_per_layer_input=small.pop("hidden_size_per_layer_input", 16),
            embedding_dim=small.pop("embedding_dim", small["hidden_size"] - 8), **small)
    elif family == "t5":  # GTR's and sentence-T5's encoder: relative-position buckets past 8 tokens, a gated GELU
        tokenizer = _t5_tokenizer(max_positions)
        heads = small["num_attention_heads"]
        head_dim = small.get("head_dim", small["hidden_size"] // heads)
        config = transformers.T5Config(d_model=small["hidden_size"], d_kv=head_dim,
                                       d_ff=small["intermediate_size"], num_layers=small["num_hidden_layers"],
                                       num_heads=heads, feed_forward_proj=small.get("feed_forward_proj", "gated-gelu"),
                                       relative_attention_num_buckets=8, relative_attention_max_distance=24,
                                       pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                       is_encoder_decoder=False, use_cache=False)
    elif family in _DECODER_CONFIGS:  # decoders: RMSNorm, rotary, SwiGLU, grouped-query attention
        tokenizer = _decoder_tokenizer(max_positions, **(decoder_tokenizer or {}))
        # Mistral's window binds past 16 tokens
        config = _decoder_config(family, tokenizer, small, **({"sliding_window": 16} if family == "mistral" else {}))
    else:
        raise ValueError(f"no tiny checkpoint for {family}")
    config.vocab_size, config.max_position_embeddings = len(tokenizer), max_positions
    if num_labels:
        config.num_labels = num_labels
    if family == "t5":  # AutoModel would be the encoder-decoder; sentence-transformers loads the encoder
        model = transformers.T5EncoderModel(config)
    else:
        model = AutoModelForSequenceClassification.from_config(config) if num_labels else AutoModel.from_config(config)
    if family == "embedding_gemma2":
        # Its layer scalars start at one, trained ones do not (these alternate 0.8 and 1.2, so that their product stays
        # near one at any depth). Its attention scales by 1 and leaves the logits' size to the q and k norms' weights:
        # at one (their start), the logits of 256-wide heads spread +-16 and more, where bf16's rounding of q and k
        # moves every softmax (min cosine 0.84 against fp32 at the base size, 24 layers); at head_dim^-1/4 they spread
        # as a scaled dot product's do (0.99977).
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                layer.layer_scalar.fill_(0.8 + 0.4 * (i % 2))
                for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                    norm.weight.fill_(norm.weight.numel() ** -0.25)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


JINA_TASKS = ("retrieval.query", "retrieval.passage", "separation", "classification", "text-matching")


def task_adapters(folder: Path, tasks: tuple[str, ...] = JINA_TASKS, seed: int = 10,
                  targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2", "word_embeddings"),
                  ranks: tuple[int, ...] = (4, 2)) -> Path:
    """jina-embeddings-v3's task LoRA beside the weights in `folder`, one PEFT folder per task, saved by PEFT itself
    (random A and B, ranks taking turns, so each task moves the vectors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    for i, task in enumerate(tasks):
        torch.manual_seed(seed + i)
        rank = ranks[i % len(ranks)]
        config = LoraConfig(r=rank, lora_alpha=rank + i, target_modules=list(targets), init_lora_weights=False)
        get_peft_model(AutoModel.from_pretrained(folder), config).save_pretrained(folder / task)
    return folder


JINA_PROMPTS = {"retrieval.query": "Represent the query for retrieving evidence documents: ",
                "retrieval.passage": "Represent the document for retrieval: ", "separation": "", "classification": "",
                "text-matching": ""}
"""jina-embeddings-v3's prompts, one per task (config_sentence_transformers.json)."""


def jina_folder(folder: Path, **options) -> Path:
    """A jina-embeddings-v3-shaped sentence-transformers folder: mean pooling, normalised, a prompt and a LoRA
    adapter per task."""
    return task_adapters(sentence_transformers_folder(folder, "mean", normalize=True, family="jina_embeddings_v3",
                                                      prompts=JINA_PROMPTS, **options))


def peft_sentence_transformer(folder: Path, tasks: tuple[str, ...] = JINA_TASKS):
    """The reference for a folder with task adapters: sentence-transformers' model of it, with PEFT's LoRA layers
    of every task put into its transformer; returns (model, use(task or None)), which switches PEFT's active
    adapter (None: none)."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    encoder = model[0].auto_model
    name = {task: task.replace(".", "_") for task in tasks}  # PEFT's adapter names take no dots
    peft = PeftModel.from_pretrained(encoder, str(folder / tasks[0]), adapter_name=name[tasks[0]])
    for task in tasks[1:]:
        peft.load_adapter(str(folder / task), adapter_name=name[task])

    def use(task: str | None) -> None:
        if task is None:
            peft.base_model.disable_adapter_layers()
        else:
            peft.base_model.enable_adapter_layers()
            peft.set_adapter(name[task])

    return model, use


def sentence_transformers_folder(folder: Path, pooling: str, normalize: bool = False, max_seq_length: int = 48,
                                 family: str = "bert", dense: tuple[tuple[int, str], ...] = (),
                                 prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                                 include_prompt: bool = True, similarity_fn_name: str | None = None,
                                 chat_template: str | None = None, **checkpoint) -> Path:
    """A sentence-transformers model folder saved by sentence-transformers itself; `dense` adds Dense modules after
    pooling as (out_features, torch.nn activation class name); `chat_template` goes into the tokenizer first, so that
    sentence-transformers (6 and later) saves the Transformer as one that reads texts as chat messages."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    encoder_folder = folder.with_name(folder.name + "-encoder")
    encoder = (bert_checkpoint(encoder_folder, num_labels=None) if family == "bert"
               else family_checkpoint(encoder_folder, family, num_labels=None, **checkpoint))
    if chat_template is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(encoder)
        tokenizer.chat_template = chat_template
        tokenizer.save_pretrained(encoder)
    transformer = models.Transformer(str(encoder), max_seq_length=max_seq_length)
    modules = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling, include_prompt=include_prompt)]
    width = transformer.get_embedding_dimension()
    for i, (out_features, activation) in enumerate(dense):
        torch.manual_seed(100 + i)
        modules.append(models.Dense(width, out_features, bias=i % 2 == 0, activation_function=getattr(torch.nn, activation)()))
        width = out_features
    if normalize:
        modules.append(models.Normalize())
    prompts = dict(prompts) if prompts is not None else None  # its own copy of a shared constant
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts, default_prompt_name=default_prompt_name,
                        similarity_fn_name=similarity_fn_name).save(str(folder))
    return folder


EMBEDDINGGEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}
"""EmbeddingGemma's (and EmbeddingGemma 2's) retrieval prompts, as its config_sentence_transformers.json names them."""
CHATML_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                   "{% if message['content'] is string %}{{ message['content'] }}"
                   "{% else %}{% for part in message['content'] %}{{ part['type'] }}: {{ part['text'] }}{% endfor %}"
                   "{% endif %}<|im_end|>\n{% endfor %}")
"""ChatML, as Qwen3's tokenizers carry it, with a message's content as a string (flat) or a list of typed parts
(structured), which it renders differently, so that a render in the wrong format shows."""
QWEN3_RERANKER_TEMPLATE = (
    "{%- set instruction = messages | selectattr('role', 'eq', 'system') | map(attribute='content') | first "
    "| default('Given a web search query, retrieve relevant passages that answer the query') -%}"
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {{ instruction }}\n"
    "<Query>: {{ messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first }}\n"
    "<Document>: {{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first }}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
"""Qwen3-Reranker's prompt as a chat template over sentence-transformers' pair roles: a system message (the request's
prompt) is the instruction, else the model card's default one."""


BGE_GEMMA_RERANKER_TEMPLATE = (
    "{%- set instruction = messages | selectattr('role', 'eq', 'system') | map(attribute='content') | first "
    "| default(\"Given a query A and a passage B, determine whether the passage contains an answer to the query by "
    "providing a prediction of either 'Yes' or 'No'.\") -%}"
    "{{ bos_token }}A: {{ messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first }}\n"
    "B: {{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first }}\n"
    "{{ instruction }}")
"""bge-reranker-v2-gemma's prompt (query, passage, then the instruction) as a chat template over sentence-transformers'
pair roles, after the tokenizer's beginning-of-text token; the request's prompt replaces the model card's
instruction."""


def causal_reranker_folder(folder: Path, seed: int = 3, max_positions: int = 320, saved_by_sentence_transformers: bool = True,
                           chat_template: str | None = QWEN3_RERANKER_TEMPLATE, answers: bool = True,
                           family: str = "qwen3", scored_by_no: bool = True, bos_token: str | None = None,
                           **sizes) -> Path:
    """A Qwen3-Reranker-shaped folder: Qwen3ForCausalLM (`family`'s causal LM) with tied embeddings and the chat
    template above, saved by sentence-transformers' CrossEncoder (Transformer -> LogitScore on "yes" and "no", or on
    "yes" alone without `scored_by_no`, as bge-reranker-v2-gemma scores), or left bare. Its template alone takes about
    200 of the tiny tokenizer's tokens, hence the longer limit. `sizes` override _small's (the 0.6B shape for
    benchmarks; `head_dim` among them); `bos_token`: one of DECODER_SPECIAL as the tokenizer's beginning-of-text
    token (Gemma's tokenizers have one; its templates start with it)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    tokenizer = _decoder_tokenizer(max_positions, append_eos=False, answers=answers)
    tokenizer.chat_template = chat_template
    if bos_token is not None:
        tokenizer.bos_token = bos_token
    config = _decoder_config(family, tokenizer, _small(**sizes), vocab_size=len(tokenizer),
                             max_position_embeddings=max_positions, tie_word_embeddings=True)
    bare = folder.with_name(folder.name + "-bare") if saved_by_sentence_transformers else folder
    AutoModelForCausalLM.from_config(config).save_pretrained(bare)
    tokenizer.save_pretrained(bare)
    if saved_by_sentence_transformers:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(bare), device="cpu", local_files_only=True)
        if not scored_by_no:
            model[1].false_token_id = None  # LogitScore saves its attributes as its config
        model.save(str(folder))
    return folder


def sparse_encoder_folder(folder: Path, pooling_strategy: str = "max", seed: int = 4, activation: str = "relu",
                          **settings) -> Path:
    """A SPLADE-style SparseEncoder folder (a BERT MLM head, SpladePooling) saved by sentence-transformers itself;
    `settings` are SparseEncoder's own (prompts, default_prompt_name, max_active_dims)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    mlm_folder = _bert_mlm(folder.with_name(folder.name + "-mlm"), seed)
    modules = [MLMTransformer(str(mlm_folder), max_seq_length=48),
               SpladePooling(pooling_strategy, activation_function=activation)]
    SparseEncoder(modules=modules, device="cpu", **settings).save(str(folder))
    return folder


def csr_folder(folder: Path, seed: int = 9, hidden_dim: int = 96, k: int = 12, dense: tuple[tuple[int, str], ...] = (),
               normalize: bool = True, layer_norm: bool = False, **settings) -> Path:
    """A CSR SparseEncoder folder saved by sentence-transformers itself: a tiny BERT's mean-pooled embedding (through
    `dense`, then normalised unless told otherwise) into a SparseAutoEncoder of `hidden_dim` latents keeping `k`,
    its weights and biases random (`layer_norm`: it standardises its input first); `settings` are SparseEncoder's."""
    import torch
    from sentence_transformers import SentenceTransformer, SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

    embedding = sentence_transformers_folder(folder.with_name(folder.name + "-dense"), "mean", normalize=normalize,
                                             dense=dense)
    model = SentenceTransformer(str(embedding), device="cpu")
    modules, width = list(model), model.get_embedding_dimension()
    torch.manual_seed(seed)
    autoencoder = SparseAutoEncoder(input_dim=width, hidden_dim=hidden_dim, k=k, normalize=layer_norm)
    with torch.no_grad():  # biases off zero, so that they are tested; about half the latents above zero
        autoencoder.pre_bias.normal_(0, 0.05)
        autoencoder.latent_bias.normal_(0, 0.05)
    SparseEncoder(modules=[*modules, autoencoder], device="cpu", **settings).save(str(folder))
    return folder


def _bert_mlm(folder: Path, seed: int) -> Path:
    """A tiny BERT with its MLM head, the vocabulary a SPLADE model weighs, after seeding torch with `seed`."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    tokenizer = _wordpiece_tokenizer(64)
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=64, **_small())
    BertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def inference_free_sparse_folder(folder: Path, seed: int = 5, default_route: str = "document",
                                 query_length: int | None = 24, **settings) -> Path:
    """OpenSearch's inference-free layout saved by sentence-transformers itself: a Router whose documents go through a
    BERT MLM head and SpladePooling, and whose queries through a SparseStaticEmbedding of random positive weights
    (some tokens none), its tokenizer cut at `query_length` tokens; `settings` are SparseEncoder's own."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SparseStaticEmbedding, SpladePooling

    mlm_folder = _bert_mlm(folder.with_name(folder.name + "-mlm"), seed)
    documents = [MLMTransformer(str(mlm_folder), max_seq_length=48),
                 SpladePooling("max", activation_function="log1p_relu")]
    query_tokenizer = _wordpiece_tokenizer(query_length or int(1e30))
    vocabulary = query_tokenizer.vocab_size
    weights = torch.rand(vocabulary) * 4 * (torch.rand(vocabulary) > 0.2)
    queries = [SparseStaticEmbedding(tokenizer=query_tokenizer, weight=weights, frozen=True)]
    router = Router({"query": queries, "document": documents}, default_route=default_route)
    SparseEncoder(modules=[router], device="cpu", **settings).save(str(folder))
    return folder


def static_embedding_folder(folder: Path, dim: int = 32, normalize: bool = True, seed: int = 7,
                            model2vec: bool = False, **settings) -> Path:
    """A static embedding model saved by sentence-transformers itself: a StaticEmbedding of random vectors over the
    WordPiece vocabulary (model2vec's potion and static-retrieval-mrl's kind), then Normalize; `model2vec` rewrites
    its weights as model2vec saves a vocabulary-quantised model (`embeddings` rows shared through `mapping`, scaled by
    per-token `weights`); `settings` are SentenceTransformer's own (prompts, similarity_fn_name, truncate_dim)."""
    import torch
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding

    torch.manual_seed(seed)
    tokenizer = _wordpiece_tokenizer(64)
    static = StaticEmbedding(tokenizer, embedding_weights=torch.randn(tokenizer.vocab_size, dim))
    modules = [static, Normalize()] if normalize else [static]
    SentenceTransformer(modules=modules, device="cpu", **settings).save(str(folder))
    if model2vec:
        shared = torch.randn(tokenizer.vocab_size // 3, dim)
        save_file({"embeddings": shared, "mapping": torch.randint(0, len(shared), (tokenizer.vocab_size,)),
                   "weights": torch.rand(tokenizer.vocab_size) + 0.5}, str(folder / "model.safetensors"))
    return folder


def colbert_folder(folder: Path, seed: int = 6, dim: int = 24, expansion: dict | None = None,
                   query_length: int | None = None, document_length: int | None = 40,
                   skiplist: tuple[str, ...] | None = None, prompts: dict[str, str] | None = None,
                   similarity: str | None = None, normalize: bool = False, family: str = "bert", **sizes) -> Path:
    """A sentence-transformers MultiVectorEncoder (ColBERT) folder, saved by sentence-transformers: a tiny BERT whose
    vocabulary has punctuation, a Dense projection of every token to `dim`, and a MultiVectorMask skipping
    punctuation in documents; queries expanded with [MASK] to 16 tokens, not attended to (classic ColBERT), unless
    `expansion` says otherwise ({} turns it off); "[Q] " / "[D] " prompts; MaxSim unless `similarity` says
    "meanmaxsim"; `normalize` puts a token-level Normalize after the mask (as sentence-transformers converts PyLate's
    folders); `family` "modernbert" puts a ModernBERT under it (byte-level BPE, whose alphabet has the punctuation;
    its mask token expands queries); `sizes` override the encoder's (_small's)."""
    import string

    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    base = (bert_checkpoint(folder.with_name(folder.name + "-base"), num_labels=None, seed=seed,
                            extra_tokens=tuple(string.punctuation), **sizes) if family == "bert"
            else family_checkpoint(folder.with_name(folder.name + "-base"), family, num_labels=None, seed=seed, **sizes))
    expansion = {"strategy": "fixed", "attend": False, "length": 16} if expansion is None else expansion or None
    transformer = Transformer(str(base), query_length=query_length, document_length=document_length,
                              query_expansion=expansion)
    torch.manual_seed(seed)
    dense = Dense(transformer.get_embedding_dimension(), dim, bias=False, activation_function=torch.nn.Identity(),
                  module_input_name="token_embeddings", module_output_name="token_embeddings")
    mask = MultiVectorMask(skiplist_words=list(string.punctuation) if skiplist is None else list(skiplist))
    modules = [transformer, dense, mask] + ([Normalize(module_input_name="token_embeddings")] if normalize else [])
    model = MultiVectorEncoder(modules=modules, device="cpu",
                               prompts={"query": "[Q] ", "document": "[D] "} if prompts is None else prompts)
    if similarity:
        model.similarity_fn_name = similarity
    model.save(str(folder))
    return folder



def bge_m3_folder(folder: Path, seed: int = 7, colbert_dim: int | None = None, **checkpoint) -> Path:
    """A bge-m3-shaped folder: an XLM-R sentence-transformers model (CLS pooling, Normalize) saved by
    sentence-transformers, with FlagEmbedding's two heads beside its weights, as torch Linear state dicts:
    colbert_linear.pt (hidden -> `colbert_dim`, the hidden size by default, as bge-m3's) and sparse_linear.pt
    (hidden -> 1), both random."""

    import torch
    from transformers import AutoModel, AutoTokenizer

    sentence_transformers_folder(folder, "cls", normalize=True, family="xlm-roberta", seed=seed, **checkpoint)
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    torch.manual_seed(seed + 1)
    torch.save(torch.nn.Linear(hidden, colbert_dim or hidden).state_dict(), folder / "colbert_linear.pt")
    sparse = torch.nn.Linear(hidden, 1)
    with torch.no_grad():  # centred on the corpus's tokens, so that about half of them weigh above zero
        batch = AutoTokenizer.from_pretrained(folder)(_corpus(), padding=True, truncation=True, return_tensors="pt")
        states = AutoModel.from_pretrained(folder)(**batch).last_hidden_state[batch["attention_mask"].bool()]
        sparse.bias -= sparse(states).median()
    torch.save(sparse.state_dict(), folder / "sparse_linear.pt")
    return folder


def pylate_folder(folder: Path, seed: int = 8, dim: int = 24, query_length: int = 16, document_length: int = 40,
                  attend: bool = False, use_residual: bool = False) -> Path:
    """A ColBERT folder in PyLate's layout (PyLate is not installed here; the files are written as its ColBERT.save
    writes them, pylate 1.x on sentence-transformers 5): a tiny BERT whose tokenizer has "[Q] " and "[D] " added
    as tokens and the mask token as padding, modules.json listing the Transformer and a pylate Dense, and the rest at
    the top level of config_sentence_transformers.json (model_type "ColBERT", prefixes, lengths, expansion,
    skip-list). sentence-transformers' MultiVectorEncoder reads it through its PyLate fix-ups."""
    import string

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    base = bert_checkpoint(folder.with_name(folder.name + "-base"), num_labels=None, seed=seed,
                           extra_tokens=tuple(string.punctuation))
    tokenizer, model = AutoTokenizer.from_pretrained(base), AutoModel.from_pretrained(base)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    model.resize_token_embeddings(len(tokenizer))
    tokenizer.pad_token = tokenizer.mask_token
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    hidden = model.config.hidden_size
    torch.manual_seed(seed)
    (folder / "1_Dense").mkdir()
    weights = {name: torch.randn(dim, hidden) / hidden ** 0.5
               for name in ("linear.weight", "residual.weight")[: 2 if use_residual else 1]}
    save_file(weights, folder / "1_Dense" / "model.safetensors")
    files = {
        "1_Dense/config.json": {"in_features": hidden, "out_features": dim, "bias": False,
                                "activation_function": "torch.nn.modules.linear.Identity", "use_residual": use_residual},
        "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                         {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}],
        "sentence_bert_config.json": {"max_seq_length": 48, "do_lower_case": False},
        "config_sentence_transformers.json": {
            "__version__": {"sentence_transformers": "5.1.1", "transformers": "4.56.2", "pytorch": "2.8.0",
                            "pylate": "1.3.2"},
            "model_type": "ColBERT", "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "MaxSim",
            "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": query_length,
            "document_length": document_length, "attend_to_expansion_tokens": attend,
            "skiplist_words": list(string.punctuation), "do_query_expansion": True},
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2))
    return folder
