"""Tensor storage formats: dense decoding, block dequantization, and resident packed weights."""
