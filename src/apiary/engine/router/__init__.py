"""The Router: admission of messages, their lifecycle, credits, delivery to live streams."""
