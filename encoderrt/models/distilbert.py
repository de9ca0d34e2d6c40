"""DistilBERT: BERT's layers without segment embeddings or pooler, under its own config names.

Its classification head reads the first token through `pre_classifier` and a ReLU.
"""

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="distilbert",
    model_types=("distilbert",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    config_aliases={"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                    "intermediate_size": "hidden_dim"},
)
