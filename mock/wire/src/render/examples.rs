//! The examples of `provider-streams.md` (Examples A-F), verbatim, for comparison.

pub(super) const EXAMPLE_A: &str = r##"event: message_start
data: {"type":"message_start","message":{"id":"msg_01MockA1b2C3d4E5f6G7h8J9","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":812,"cache_creation_input_tokens":0,"cache_read_input_tokens":4096,"output_tokens":1,"service_tier":"standard"}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants the size of build.log; "}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"I should stat the file first."}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCkYIBhgCKkD3mockSignatureBase64=="}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me check "}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"that file."}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01MockStat9xYz","name":"stat_file","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"pa"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"th\": \"build.log\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":87}}

event: message_stop
data: {"type":"message_stop"}

"##;

pub(super) const EXAMPLE_B: &str = r##"event: message_start
data: {"type":"message_start","message":{"id":"msg_01MockB","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":40,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"The three causes are"}}

event: error
data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_01MockReq"}

"##;

pub(super) const EXAMPLE_C: &str = r##"data: {"id":"chatcmpl-Mock7q","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-2025-04-14","system_fingerprint":"fp_mock01","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_MockA1","type":"function","function":{"name":"stat_file","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-Mock7q","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-2025-04-14","system_fingerprint":"fp_mock01","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\": \"bu"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-Mock7q","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-2025-04-14","system_fingerprint":"fp_mock01","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ild.log\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-Mock7q","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-2025-04-14","system_fingerprint":"fp_mock01","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_MockB2","type":"function","function":{"name":"stat_file","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-Mock7q","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-2025-04-14","system_fingerprint":"fp_mock01","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"path\": \"test.log\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-Mock7q","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-2025-04-14","system_fingerprint":"fp_mock01","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}

data: {"id":"chatcmpl-Mock7q","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-2025-04-14","system_fingerprint":"fp_mock01","choices":[],"usage":{"prompt_tokens":512,"completion_tokens":38,"total_tokens":550,"prompt_tokens_details":{"cached_tokens":384,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}

data: [DONE]

"##;

pub(super) const EXAMPLE_D: &str = r##"data: {"id":"chatcmpl-Mock8r","object":"chat.completion.chunk","created":1767225660,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-Mock8r","object":"chat.completion.chunk","created":1767225660,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}

data: {"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}

"##;

pub(super) const EXAMPLE_E: &str = r##"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_Mock01","object":"response","created_at":1767225700,"status":"in_progress","background":false,"error":null,"incomplete_details":null,"model":"gpt-5-2025-08-07","output":[],"previous_response_id":null,"usage":null}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_Mock01","object":"response","created_at":1767225700,"status":"in_progress","model":"gpt-5-2025-08-07","output":[],"usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_Mock01","type":"message","role":"assistant","status":"in_progress","content":[]}}

event: response.content_part.added
data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_Mock01","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_Mock01","output_index":0,"content_index":0,"delta":"Checking ","logprobs":[],"obfuscation":"k3Z"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_Mock01","output_index":0,"content_index":0,"delta":"the log.","logprobs":[],"obfuscation":"Qp"}

event: response.output_text.done
data: {"type":"response.output_text.done","sequence_number":6,"item_id":"msg_Mock01","output_index":0,"content_index":0,"text":"Checking the log.","logprobs":[]}

event: response.content_part.done
data: {"type":"response.content_part.done","sequence_number":7,"item_id":"msg_Mock01","output_index":0,"content_index":0,"part":{"type":"output_text","text":"Checking the log.","annotations":[]}}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":8,"output_index":0,"item":{"id":"msg_Mock01","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Checking the log.","annotations":[]}]}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":9,"output_index":1,"item":{"id":"fc_Mock01","type":"function_call","status":"in_progress","call_id":"call_MockC3","name":"stat_file","arguments":""}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":10,"item_id":"fc_Mock01","output_index":1,"delta":"{\"path\":\"bu","obfuscation":"x"}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":11,"item_id":"fc_Mock01","output_index":1,"delta":"ild.log\"}","obfuscation":"7Ye"}

event: response.function_call_arguments.done
data: {"type":"response.function_call_arguments.done","sequence_number":12,"item_id":"fc_Mock01","output_index":1,"name":"stat_file","arguments":"{\"path\":\"build.log\"}"}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":13,"output_index":1,"item":{"id":"fc_Mock01","type":"function_call","status":"completed","call_id":"call_MockC3","name":"stat_file","arguments":"{\"path\":\"build.log\"}"}}

event: response.completed
data: {"type":"response.completed","sequence_number":14,"response":{"id":"resp_Mock01","object":"response","created_at":1767225700,"completed_at":1767225702,"status":"completed","error":null,"incomplete_details":null,"model":"gpt-5-2025-08-07","output":[{"id":"msg_Mock01","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Checking the log.","annotations":[]}]},{"id":"fc_Mock01","type":"function_call","status":"completed","call_id":"call_MockC3","name":"stat_file","arguments":"{\"path\":\"build.log\"}"}],"usage":{"input_tokens":640,"input_tokens_details":{"cached_tokens":512},"output_tokens":45,"output_tokens_details":{"reasoning_tokens":16},"total_tokens":685}}}

"##;

pub(super) const EXAMPLE_F: &str = r##"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_Mock02","object":"response","created_at":1767225800,"status":"in_progress","model":"gpt-5-2025-08-07","output":[],"usage":null}}

event: error
data: {"type":"error","sequence_number":1,"code":"server_error","message":"The server had an error processing your request.","param":null}

event: response.failed
data: {"type":"response.failed","sequence_number":2,"response":{"id":"resp_Mock02","object":"response","created_at":1767225800,"status":"failed","error":{"code":"server_error","message":"The server had an error processing your request."},"incomplete_details":null,"model":"gpt-5-2025-08-07","output":[],"usage":null}}

"##;
