"""Loading processors that want a video processor, without torchvision.

torchvision is not installed (PyPI's wheels break beside our torch pin), and
transformers 5 needs it for every video processor. A Qwen2-VL-family processor
(Qwen2-VL, Qwen2.5-VL, and others whose processor takes `image_processor`,
`tokenizer` and `video_processor`) therefore fails in two ways:
`AutoProcessor.from_pretrained` raises "requires the Torchvision library" (or
"Can't load video processor"), and building the processor by hand with
`video_processor=None` fails its class check, because the `VideoProcessorMixin`
it checks against is itself a torchvision dummy.

We draft from still images only, so the shim is a subclass of the family's own
processor whose `__init__` does not name `video_processor`: transformers derives
a processor's parts from that signature, so it neither loads nor checks one.
Everything else (image processor, tokenizer, chat template, token expansion) is
the family's own code. This is the only module that knows about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from transformers import PretrainedConfig, ProcessorMixin

_IMAGE_TOKENIZER_VIDEO = ["image_processor", "tokenizer", "video_processor"]


def load_processor(model_dir: Path, config: PretrainedConfig) -> Any:
    """The processor saved in `model_dir`, from local files only, with the shim where one is needed."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    processor_class = _mapped_processor_class(config)
    if (
        processor_class is not None
        and not is_torchvision_available()
        and processor_class.get_attributes() == _IMAGE_TOKENIZER_VIDEO
    ):
        return without_video_processor(processor_class).from_pretrained(model_dir, local_files_only=True)
    return AutoProcessor.from_pretrained(model_dir, local_files_only=True)


def without_video_processor(processor_class: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """A subclass of `processor_class` that has no video processor part."""

    def __init__(
        self: ProcessorMixin,
        image_processor: Any = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        processor_class.__init__(
            self,
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=chat_template,
            **kwargs,
        )

    # Same class name: `save_pretrained` records `processor_class` from it, and a
    # processor saved here must load as the real family processor elsewhere.
    return type(
        processor_class.__name__,
        (processor_class,),
        {"__init__": __init__, "__module__": __name__, "__doc__": processor_class.__doc__},
    )


def _mapped_processor_class(config: PretrainedConfig) -> type[ProcessorMixin] | None:
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    try:
        # a processor class (transformers types the auto mappings' values as tokenizers' (slow, fast) pairs)
        return cast("type[ProcessorMixin]", PROCESSOR_MAPPING[type(config)])
    except (KeyError, ValueError):
        return None
