"""BERT and the families that share its graph exactly (MiniLM, bge, e5 are BERT checkpoints)."""

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="bert",
    model_types=("bert",),
    uses_token_type_ids=True,
    classifier_input="pooler",
    position_offset_from_padding=False,
    packed_layout=True,
)
