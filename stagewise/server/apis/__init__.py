"""The other APIs the server speaks (Anthropic's Messages, OpenAI's Responses, Ollama's): each read as a chat
request (``*_request``), run through the chat path, and answered in its own shapes (``*_format``, ``*_handler``)."""
