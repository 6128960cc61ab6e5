"""What transformers' DeiT and DINOv2 model testers share (tests/upstream/test_deit.py, test_dinov2.py): their
fields with upstream's defaults, their inputs and mask details, and the checks both ``create_and_check_*``
methods make."""

from __future__ import annotations

from .common import attention_fields, floats_tensor, ids_tensor


class VisionModelTester:
    """What transformers' DeiT and DINOv2 model testers share, with their defaults: 13 images of 30x30 in 2x2
    patches, hidden 32, 2 layers, 4 heads, dropouts of 0.1, 10 classes, eager attention, and their mask
    details: ``seq_length`` is the prefix tokens and the patches, ``num_masks`` counts ``mask_ratio`` of the
    sequence, ``mask_length`` the patches (the eager-vs-sdpa test masks the first ``num_masks`` patches). A
    family's tester sets ``num_prefix_tokens``, its own fields, ``get_config`` and its
    ``create_and_check_*`` methods; keyword arguments override any field, as upstream's ``__init__``
    arguments do."""

    batch_size, image_size, patch_size, num_channels = 13, 30, 2, 3
    is_training, use_labels = True, True
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    hidden_act, hidden_dropout_prob, attention_probs_dropout_prob = "gelu", 0.1, 0.1
    type_sequence_label_size, initializer_range, scope = 10, 0.02, None
    attn_implementation, mask_ratio = "eager", 0.5
    num_prefix_tokens: int  # [CLS] (and DeiT's distillation token) before the patches

    def __init__(self, parent, attention_type: str, **fields):
        self.parent, self.attention_type = parent, attention_type
        for name, value in fields.items():
            if not hasattr(self, name):
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)
        num_patches = (self.image_size // self.patch_size) ** 2
        self.seq_length = num_patches + self.num_prefix_tokens
        self.num_masks = int(self.mask_ratio * self.seq_length)
        self.mask_length = num_patches

    def config_fields(self) -> dict:
        """The config fields both upstream testers pass, plus our attention type and its small config."""
        names = (
            "image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "intermediate_size", "hidden_act", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "initializer_range", "attn_implementation",
        )  # fmt: skip
        fields = {name: getattr(self, name) for name in names}
        return {**fields, "is_decoder": False, **attention_fields(self.attention_type)}

    def prepare_config_and_inputs(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        labels = ids_tensor([self.batch_size], self.type_sequence_label_size) if self.use_labels else None
        return self.get_config(), pixel_values, labels

    def prepare_config_and_inputs_for_common(self):
        config, pixel_values, _ = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}

    def check_last_hidden_state(self, model_class, config, pixel_values):
        """Upstream's ``create_and_check_model``: (batch, seq_length, hidden_size) hidden states."""
        result = model_class(config).eval()(pixel_values)
        expected = (self.batch_size, self.seq_length, self.hidden_size)
        self.parent.assertEqual(result.last_hidden_state.shape, expected)

    def check_image_classifier(self, model_class, config, pixel_values, labels, grey_labels):
        """Upstream's ``create_and_check_for_image_classification``: logits of ``type_sequence_label_size``
        classes, on RGB images with labels, then on greyscale images (with labels where upstream's does)."""
        config.num_labels = self.type_sequence_label_size
        result = model_class(config).eval()(pixel_values, labels=labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.type_sequence_label_size))
        # test greyscale images
        config.num_channels = 1
        model = model_class(config).eval()
        pixel_values = floats_tensor([self.batch_size, 1, self.image_size, self.image_size])
        result = model(pixel_values, labels=labels if grey_labels else None)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.type_sequence_label_size))


def without_classes(test, names: tuple[str, ...]):
    """The mixin's ``test`` run on ``all_model_classes`` less the classes named (upstream's DeiT tests leave
    its inference-only classifier with a teacher out of the training tests)."""

    def run(self, *args, **kwargs):
        kept = tuple(c for c in self.all_model_classes if c.__name__ not in names)
        self.all_model_classes, saved = kept, self.all_model_classes
        try:
            return test(self, *args, **kwargs)
        finally:
            self.all_model_classes = saved

    run.__name__ = run.__qualname__ = test.__name__
    run.__doc__ = f"{test.__name__} without {', '.join(names)}."
    return run
