"""Errors the core raises for input it refuses; each message names the problem."""


class LayoutError(ValueError):
    """A request, image or model configuration that cannot be laid out."""


class UnknownFamilyError(LayoutError):
    """No known model family matches the given name, model_type or model id."""


class ProcessorConfigError(LayoutError):
    """A processor config value is missing, malformed or out of range."""


class ImageError(LayoutError):
    """Image bytes that are not an image, are truncated, or have impossible dimensions."""


class ConfigError(ValueError):
    """A config file, ready file or target value that cannot be used; the message names the
    key and what was expected."""
