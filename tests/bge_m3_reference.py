"""bge-m3's three outputs and its hybrid score, written in plain PyTorch from its published formulas (FlagEmbedding's
BGEM3FlagModel, whose package installs here but does not import with transformers 5: it imports
transformers.modeling_attn_mask_utils, which transformers 5 removed).

dense = the CLS state, normalised; sparse = relu(sparse_linear(h)) max-pooled per token id, the CLS, end, padding and
unknown tokens dropped; colbert = normalised colbert_linear(h[1:]); a pair's hybrid score = (w_dense dense + w_sparse
sparse + w_colbert colbert) / the weights' sum, with dense the dot product, sparse the sum over shared ids of the
weights' products and colbert the mean over query vectors of each one's best dot product."""


def reference(folder, texts, max_length=48):
    """(dense, {token id: weight}, colbert vectors) per text, by bge-m3's formulas, one text at a time."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    heads = {}
    for name in ("colbert_linear", "sparse_linear"):
        state = torch.load(folder / f"{name}.pt", weights_only=True)
        heads[name] = torch.nn.Linear(state["weight"].shape[1], state["weight"].shape[0])
        heads[name].load_state_dict(state)
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    results = []
    with torch.no_grad():
        for text in texts:
            batch = tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)[0].numpy()
            weights = torch.relu(heads["sparse_linear"](hidden))[0, :, 0].tolist()
            lexical = {}
            for token, weight in zip(batch["input_ids"][0].tolist(), weights):
                if token not in unused and weight > lexical.get(token, 0):
                    lexical[token] = weight
            colbert = torch.nn.functional.normalize(heads["colbert_linear"](hidden[:, 1:]), dim=-1)[0].numpy()
            results.append((dense, lexical, colbert))
    return results


def hybrid_score(query, document, weights=(0.4, 0.2, 0.4)):
    dense = float(query[0] @ document[0])
    sparse = sum(weight * document[1].get(token, 0.0) for token, weight in query[1].items())
    colbert = float((query[2] @ document[2].T).max(axis=1).sum() / len(query[2]))
    return (weights[0] * dense + weights[1] * sparse + weights[2] * colbert) / sum(weights)
