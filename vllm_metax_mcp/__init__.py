"""vllm-metax-mcp: an MCP server for upgrading and trimming vLLM-MetaX models."""

__version__ = "0.1.0"
