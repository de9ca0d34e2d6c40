"""ELECTRA discriminators: BERT's encoder (with segment ids) behind an embedding projection when
embedding_size differs from hidden_size; the classification head is dense + GELU + out_proj on
the first token, hence one GELU more than the layers."""

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="electra",
    model_types=("electra",),
    uses_token_type_ids=True,
    classifier_input="first_token",
    position_offset_from_padding=False,
    head_gelus=1,
)
