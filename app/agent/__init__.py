"""Qt-free tool use for chats: MCP server configuration (mcp.json), the MCP client sessions, approvals,
and the rounds of a reply that calls tools."""
